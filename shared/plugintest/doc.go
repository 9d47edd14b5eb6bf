// Package plugintest is for testing against the plugin contracts of
// shared/plugin, from either side: a mock trainer and a mock averager that
// stand in for real ones, RelayGroup (an in-process relay among goroutines,
// so N averagers can meet in one test), and helpers to build plugins and
// run them as real go-plugin processes. A vendor tests an averager with
// RelayGroup and the mock trainer; the core tests itself with both mocks.
// The conformance suite for a vendor's plugin lives in
// shared/plugintest/conformance; docs/plugins.md ("Testing") shows how the
// pieces fit.
//
// The mock trainer (Trainer) is a deterministic logistic regression on data
// generated from the run's seed; the mock averager (Averager) computes a real
// step-weighted average across the ranks through the relay. Both implement
// the contracts of shared/plugin, so the same values can be checked
// in-process and through the gRPC adapters. The binaries
// cmd/cohort-trainer-mock and cmd/cohort-averaging-mock serve them;
// BuildPlugins builds those and StartTrainer and StartAverager launch them
// under go-plugin.
package plugintest
