// Command cohort runs data-parallel training: `cohort run` trains on this
// machine with a local coordinator and N rank workers; `cohort coordinator`
// and `cohort worker` run the two halves apart for multi-host runs.
package main

import (
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: cohort <command> [flags]

commands:
  run          train on this machine: a coordinator and N rank workers
  coordinator  run the coordinator alone (multi-host runs)
  worker       run one rank worker against a coordinator
  plugins      list the plugins a worker would find, and their checksum status
  version      print the version

Run 'cohort <command> -h' for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	switch cmd {
	case "run":
		code = runCommand(args)
	case "coordinator":
		code = coordinatorCommand(args)
	case "worker":
		code = workerCommand(args)
	case "plugins":
		code = pluginsCommand(args)
	case "version", "-version", "--version":
		fmt.Println("cohort", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "cohort: unknown command %q\n\n%s", cmd, usage)
		code = 2
	}
	os.Exit(code)
}
