package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The Python process dies with its host, however the host dies, and takes
// its socket with it: here the host is a shell that started the launcher
// (which became Python) and is SIGKILLed once the handshake is out.
func TestExitsWithItsHost(t *testing.T) {
	bin := buildPlugin(t)
	sockets := t.TempDir()
	host := exec.Command("sh", "-c", `"$1" & echo $!; wait`, "sh", bin)
	host.Env = append(os.Environ(), "COHORT_PLUGIN_MAGIC_COOKIE=7c1d9e4a2f6b08e5d3a1c47b9f20e6d85a3c1b7e",
		"PLUGIN_PROTOCOL_VERSIONS=1,2,3", "PLUGIN_UNIX_SOCKET_DIR="+sockets, "PLUGIN_CLIENT_CERT=")
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer host.Process.Kill()
	lines := bufio.NewScanner(out)
	var pid int
	var handshake string
	for handshake == "" && lines.Scan() {
		if pid == 0 {
			pid, _ = strconv.Atoi(lines.Text())
			continue
		}
		handshake = lines.Text()
	}
	if pid == 0 || !strings.HasPrefix(handshake, "1|3|unix|") {
		t.Fatalf("plugin pid %d, handshake %q: want the pid, then go-plugin's line at protocol 3", pid, handshake)
	}
	socket := strings.Split(handshake, "|")[3]
	if filepath.Dir(socket) != sockets {
		t.Errorf("the socket %s is not in PLUGIN_UNIX_SOCKET_DIR %s", socket, sockets)
	}
	if err := host.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	host.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the plugin (pid %d) outlived its host by 10 s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(socket); err == nil {
		t.Errorf("the plugin left its socket %s behind", socket)
	}
}
