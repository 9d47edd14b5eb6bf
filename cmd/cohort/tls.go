package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/shared/mtls"
)

func newTLSCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Make certificates for mutual TLS between the coordinator and its workers",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			return usageError("a tls command is needed: init")
		},
	}
	cmd.AddCommand(newTLSInitCommand())
	return cmd
}

func newTLSInitCommand() *cobra.Command {
	var out string
	var hosts []string
	var localhost bool
	var days int
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Write a CA and a certificate per host into a directory",
		Long: `Writes a new certificate authority (ca.pem) and, for each host, a
certificate (HOST.pem) and its key (HOST-key.pem, mode 0600) into --out:
ECDSA P-256, each certificate valid for its host's name or address and
usable by the coordinator and by workers alike. Copy ca.pem and a host's two
files to that host and name them in the config's coordinator { tls { } }
and worker { tls { } } blocks. The CA's key is not kept: to add a host, run
init again into a new directory and hand out the new files.

For small clusters and tests; a site with its own CA issues the files
itself (each certificate needs serverAuth and clientAuth usage).`,
		Example: `  cohort tls init --out tls --hosts head,node1,node2,10.0.0.7
  cohort tls init --out tls --hosts "$(hostname)" --localhost   # one machine: cohort run`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case out == "":
				return usageError("--out is required")
			case len(hosts) == 0:
				return usageError("--hosts is required")
			case days < 1:
				return usageError("--days must be at least 1, got %d", days)
			}
			var extra []string
			if localhost {
				extra = mtls.Loopback
			}
			if err := mtls.WriteCluster(out, hosts, extra, time.Duration(days)*24*time.Hour); err != nil {
				return failed(err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "wrote %s\n", filepath.Join(out, mtls.CAFile))
			for _, h := range hosts {
				f := mtls.HostFiles(out, h)
				fmt.Fprintf(w, "wrote %s and %s (for %s)\n", f.Cert, f.Key, h)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory to write into (made if missing; refused if it holds a ca.pem)")
	f.StringSliceVar(&hosts, "hosts", nil, "host names and IP addresses, comma-separated: one certificate each")
	f.BoolVar(&localhost, "localhost", false, "make every certificate valid for localhost, 127.0.0.1 and ::1 too (cohort run dials loopback)")
	f.IntVar(&days, "days", int(mtls.DefaultValidity/(24*time.Hour)), "days the certificates stay valid")
	return cmd
}
