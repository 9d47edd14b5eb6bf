// Package plugintest holds a mock trainer and a mock averager for testing the
// core without libtorch or a real averaging backend, and helpers to run them
// in-process or as real go-plugin processes.
//
// The mock trainer (Trainer) is a deterministic logistic regression on data
// generated from the run's seed; the mock averager (Averager) computes a real
// step-weighted average across the ranks through the relay
// (plugin.Relay), wherever they run. RelayGroup is an in-process relay for
// testing any averager without a coordinator. Both mocks implement the
// contracts of shared/plugin, so the same values can be checked in-process
// and through the gRPC adapters.
// The binaries cmd/cohort-trainer-mock and cmd/cohort-averaging-mock serve
// them; BuildPlugins builds those and StartTrainer and StartAverager launch
// them under go-plugin.
package plugintest
