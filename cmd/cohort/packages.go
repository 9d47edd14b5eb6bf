package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/pluginpkg"
	"github.com/cohortdl/cohort/shared/plugin"
)

func newKeygenCommand() *cobra.Command {
	var prefix string
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Make an ed25519 key pair for signing plugin packages",
		Long: `Writes PREFIX.key, the private key (mode 0600: keep it secret), and
PREFIX.pub, the public key users pass to 'cohort plugins install --trust'.
Each file is two lines: a header naming the key, then the raw key in base64
(the 64-byte ed25519 private key, or the 32-byte public key).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if prefix == "" {
				return usageError("-o PREFIX is required")
			}
			pub, key, err := pluginpkg.GenerateKey(prefix)
			if err != nil {
				return failed(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (private) and %s (public)\n", key, pub)
			return nil
		},
	}
	cmd.Flags().StringVarP(&prefix, "out", "o", "", "path prefix of the key files (required)")
	return cmd
}

func newPackageCommand(g *globals) *cobra.Command {
	var name, kind, version, keyFile, out, protocols string
	var bins, requires []string
	cmd := &cobra.Command{
		Use:   "package",
		Short: "Write a signed plugin package",
		Long: `Writes a signed plugin package, a .tar.gz holding the plugin's binary for
each platform (bin/OS_ARCH/cohort-trainer-NAME or cohort-averaging-NAME),
manifest.json (format, kind, name, version, protocols, platforms, and
what the plugin needs on the host besides its binary, --requires),
SHA256SUMS over every file and SHA256SUMS.sig, the base64 ed25519
signature of SHA256SUMS made with --key. Without --bin the package holds
the plugin a worker would find for this platform. The binary for this
platform, if the package holds one, is started briefly: a --version other
than the one its Describe reports is refused.`,
		Example: `  cohort plugins package --name median --kind averager --version 1.2.0 --key release.key \
    --bin linux/amd64=out/amd64/cohort-averaging-median --bin linux/arm64=out/arm64/cohort-averaging-median \
    -o median-1.2.0.tar.gz
  cohort plugins package --name pytorch --kind trainer --version 0.1.0 --key release.key \
    --requires "python3 >= 3.9" --requires torch --requires grpcio --requires "protobuf >= 3.20" -o pytorch-0.1.0.tar.gz`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case name == "" || version == "" || keyFile == "" || out == "":
				return usageError("--name, --kind, --version, --key and -o are required")
			case kind != string(pluginhost.Trainer) && kind != string(pluginhost.Averager):
				return usageError("--kind must be trainer or averager, not %q", kind)
			}
			protos, err := parseProtocols(protocols)
			if err != nil {
				return usageError("--protocols: %v", err)
			}
			binaries := map[string]string{}
			for _, b := range bins {
				plat, path, ok := strings.Cut(b, "=")
				if !ok || plat == "" || path == "" {
					return usageError("--bin %q: want OS/ARCH=PATH", b)
				}
				if _, dup := binaries[plat]; dup {
					return usageError("--bin: %s given twice", plat)
				}
				binaries[plat] = path
			}
			if len(binaries) == 0 {
				cfg, err := g.loadConfig()
				if err != nil {
					return err
				}
				loc, err := pluginhost.Find(pluginDirs(cfg), pluginhost.Kind(kind), name)
				if err != nil {
					return failed(fmt.Errorf("no --bin given, and %w", err))
				}
				binaries[pluginpkg.Platform()] = loc.Path
			}
			key, err := pluginpkg.LoadPrivateKey(keyFile)
			if err != nil {
				return failed(err)
			}
			if err := checkPackagedVersion(cmd, pluginhost.Kind(kind), name, version, binaries[pluginpkg.Platform()]); err != nil {
				return failed(err)
			}
			f, err := os.Create(out)
			if err != nil {
				return failed(fmt.Errorf("write package: %w", err))
			}
			m, err := pluginpkg.Build(f, pluginpkg.BuildOptions{
				Kind: pluginhost.Kind(kind), Name: name, Version: version,
				Protocols: protos, Binaries: binaries, Requires: requires, Key: key,
			})
			if cerr := f.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("write package %s: %w", out, cerr)
			}
			if err != nil {
				os.Remove(out)
				return failed(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s %s for %d platform(s)\n", out, m.Kind, m.Name, m.Version, len(m.Platforms))
			if len(m.Requires) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "requires: %s\n", strings.Join(m.Requires, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the plugin's name (required)")
	f.StringVar(&kind, "kind", "", "trainer or averager (required)")
	f.StringVar(&version, "version", "", "the plugin's version, which its Describe must report (required)")
	f.StringVar(&keyFile, "key", "", "the private key file from 'cohort plugins keygen' (required)")
	f.StringVarP(&out, "out", "o", "", "the package file to write, FILE.tar.gz (required)")
	f.StringArrayVar(&bins, "bin", nil, "OS/ARCH=PATH: the binary for a platform; repeat for each")
	f.StringArrayVar(&requires, "requires", nil, "what the plugin needs on the host besides its binary (\"python3 >= 3.9\", \"torch\"); repeat for each")
	f.StringVar(&protocols, "protocols", joinInts(plugin.Protocols()), "the plugin protocol versions the binaries serve, comma-separated")
	return cmd
}

func newInstallCommand(g *globals) *cobra.Command {
	var trust, dir, lockPath string
	var replaceSigner bool
	cmd := &cobra.Command{
		Use:   "install FILE",
		Short: "Verify a signed plugin package and install its plugin",
		Long: `Verifies the package FILE: its signature with the --trust public key, every
file against its SHA256SUMS and the manifest against the files, and starts
the binary for this platform briefly: its Describe must report the
manifest's version. Against the plugin lock (default: the config's
worker.plugin_lock, cohort.lock.json beside the config file) it refuses a
package signed by another key than the one the lock pins for the plugin
(the signer of the package installed first; --replace-signer accepts the
new one and pins it), and another binary under a version the lock already
accepted. Then it installs the binary into the plugin directory (default:
the config's worker.plugin_dir) as cohort-trainer-NAME or
cohort-averaging-NAME, adds its line to that directory's SHA256SUMS, and
records its checksum, version and signer in the lock. Workers refuse a
locked plugin whose binary no longer matches the lock.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError("install takes one package FILE")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if trust == "" {
				return usageError("--trust PUBKEY is required")
			}
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			if dir == "" {
				dir = cfg.Worker.PluginDir
			}
			if lockPath == "" {
				lockPath = cfg.Worker.PluginLock
			}
			if lockPath == "" {
				lockPath = pluginhost.DefaultLockFile
			}
			pub, err := pluginpkg.LoadPublicKey(trust)
			if err != nil {
				return failed(err)
			}
			p, err := pluginpkg.Open(args[0], pub)
			if err != nil {
				return failed(err)
			}
			defer p.Close()
			inst, err := p.Install(cmd.Context(), dir, lockPath, pluginpkg.Platform(),
				pluginpkg.InstallOptions{Describe: describer(), ReplaceSigner: replaceSigner})
			if err != nil {
				return failed(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed %s %s %s as %s (sha256 %x); locked in %s\n",
				p.Manifest.Kind, p.Manifest.Name, p.Manifest.Version, inst.Path, inst.SHA256, filepath.Clean(lockPath))
			if len(p.Manifest.Requires) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "it needs on this host: %s\n", strings.Join(p.Manifest.Requires, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&trust, "trust", "", "the signer's public key file (required)")
	f.StringVar(&dir, "dir", "", "the plugin directory to install into (default: the config's worker.plugin_dir)")
	f.StringVar(&lockPath, "lock", "", "the plugin lock file (default: the config's worker.plugin_lock)")
	f.BoolVar(&replaceSigner, "replace-signer", false, "accept a package signed by another key than the one the lock pins for the plugin, and pin that key")
	return cmd
}

// describeTimeout bounds starting a plugin binary to ask for its
// Description, as pluginhost's start does.
const describeTimeout = pluginhost.DefaultStartTimeout

// describer starts a plugin binary briefly, without the run secret in its
// environment, and returns what it says of itself.
func describer() pluginpkg.Describer {
	host := pluginhost.New(pluginhost.Options{StartTimeout: describeTimeout, Withhold: []string{envSecret, envSecretFile}})
	return func(ctx context.Context, loc pluginhost.Located) (pluginhost.Probe, error) {
		return host.Probe(ctx, loc, describeTimeout)
	}
}

// checkPackagedVersion starts bin, the binary a package holds for this
// platform (none: nothing to check), and refuses a version other than
// the one its Describe reports. A binary that does not start here (built
// for a machine with libraries this one lacks, say) is packaged with a
// warning: install checks it where it runs.
func checkPackagedVersion(cmd *cobra.Command, kind pluginhost.Kind, name, version, bin string) error {
	if bin == "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "no binary for this platform (%s): its version is checked on install\n", pluginpkg.Platform())
		return nil
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	p, err := describer()(ctx, pluginhost.Located{Kind: kind, Name: name, Path: abs})
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s does not start here, so its version is checked on install only: %v\n", bin, err)
		return nil
	}
	if err := pluginpkg.CheckDescribed(version, p.Description.Version, pluginpkg.Platform()); err != nil {
		return fmt.Errorf("package %s %q %s: %w", kind, name, version, err)
	}
	return nil
}

func parseProtocols(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%q is not a protocol version", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func joinInts(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}
