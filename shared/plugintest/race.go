//go:build race

package plugintest

// raceEnabled: this binary runs under the race detector, so BuildPlugins
// builds the plugins with -race too (their packages are then already in the
// build cache).
const raceEnabled = true
