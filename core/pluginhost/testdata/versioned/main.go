// Command versioned is a tiny averaging plugin for cohort's version tests.
// $VERSIONED_PROTOCOLS lists the plugin protocol versions it serves
// ("1", "1,2", "3"; empty: the SDK's default), $VERSIONED_VERSION is the
// version its Describe reports. Versions the SDK does not speak (a plugin
// from the future or the past) are served through go-plugin directly, as
// another SDK would. Configure reports in SoloIdentity whether it got a
// Relay, so a test sees what the negotiated protocol carried.
package main

import (
	"context"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/shared/plugin"
)

type averager struct{}

func (averager) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: "versioned", Version: os.Getenv("VERSIONED_VERSION")}, nil
}

func (averager) Configure(_ context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	return plugin.AveragerTraits{SoloIdentity: cfg.Relay != nil}, nil
}

func (averager) Average(context.Context, plugin.Round) (plugin.RoundResult, error) {
	return plugin.RoundResult{}, nil
}
func (averager) NewSessionID(context.Context) ([]byte, error)        { return nil, nil }
func (averager) NewSession(context.Context, plugin.Session) error    { return nil }
func (averager) Abort(context.Context, string) error                 { return nil }
func (averager) SaveState(context.Context, string) ([]string, error) { return nil, nil }
func (averager) LoadState(context.Context, string) error             { return nil }
func (averager) Shutdown(context.Context) error                      { return nil }

func main() {
	var protocols []int
	foreign := false
	for _, f := range strings.Split(os.Getenv("VERSIONED_PROTOCOLS"), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil {
			os.Exit(2)
		}
		protocols = append(protocols, v)
		foreign = foreign || v < plugin.OldestProtocol || v > plugin.ProtocolVersion
	}
	if foreign {
		sets := map[int]goplugin.PluginSet{}
		for _, v := range protocols {
			sets[v] = goplugin.PluginSet{plugin.KindAverager: plugin.AveragerPlugin{Impl: averager{}}}
		}
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig:  plugin.Handshake(),
			VersionedPlugins: sets,
			GRPCServer:       goplugin.DefaultGRPCServer,
		})
		return
	}
	plugin.Serve(plugin.ServeOptions{
		Protocols: protocols,
		Averager:  func(hclog.Logger) (plugin.Averager, error) { return averager{}, nil },
	})
}
