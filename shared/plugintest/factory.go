package plugintest

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/cohortdl/cohort/shared/plugin"
)

// NoiseEnv set to "1" makes TrainerFactory print junk to stdout before it
// returns, as libtorch does when it loads, to prove plugin.Serve keeps the
// handshake line clean.
const NoiseEnv = "COHORT_MOCK_NOISE"

// TrainerFactory is the mock trainer's plugin.ServeOptions.Trainer.
func TrainerFactory(logger hclog.Logger) (plugin.Trainer, error) {
	if os.Getenv(NoiseEnv) == "1" {
		printNoise("mock trainer factory")
	}
	return NewTrainer(logger), nil
}

// AveragerFactory is the mock averager's plugin.ServeOptions.Averager.
func AveragerFactory(logger hclog.Logger) (plugin.Averager, error) {
	return NewAverager(logger), nil
}

// printNoise writes junk to stdout twice: through os.Stdout, and straight to
// file descriptor 1, which is what native code does.
func printNoise(where string) {
	fmt.Println("junk on stdout from", where, "through fmt")
	// A failed write to stdout is exactly what a protected stdout may do.
	_, _ = unix.Write(1, []byte("junk on stdout from "+where+" through write(2)\n"))
}
