//go:build !race

package plugintest

const raceEnabled = false
