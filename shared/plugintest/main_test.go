package plugintest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/shared/plugin"
)

// hostEnv switches this test binary into a plugin host for the
// parent-death test: it launches the averager plugin named by the variable,
// prints "pid <plugin pid>" and waits to be killed.
const hostEnv = "COHORT_PLUGINTEST_HOST"

func TestMain(m *testing.M) {
	if bin := os.Getenv(hostEnv); bin != "" {
		os.Exit(runHost(bin))
	}
	code := m.Run()
	RemoveBuilds()
	os.Exit(code)
}

func runHost(bin string) int {
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Level: hclog.Warn, Output: os.Stderr})
	cmd := exec.Command(bin)
	cmd.Env = os.Environ()
	client := goplugin.NewClient(plugin.ClientConfig(plugin.ClientOptions{Cmd: cmd, Logger: logger, StartTimeout: 30 * time.Second}))
	avg, err := plugin.DispenseAverager(client)
	if err != nil {
		fmt.Fprintln(os.Stderr, "host:", err)
		return 1
	}
	if _, err := avg.Describe(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "host:", err)
		client.Kill()
		return 1
	}
	fmt.Printf("pid %d\n", client.ReattachConfig().Pid)
	// The test kills this process; the deadline only bounds a forgotten host.
	time.Sleep(time.Minute)
	client.Kill()
	return 1
}
