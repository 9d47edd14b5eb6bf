# cohort's default run (4 ranks, 3 epochs, seed 1) with the model, data
# and optimizer of a plain PyTorch file. From the repository's root:
#   bin/cohort run --config examples/pytorch/cohort.hcl
run {
  ranks  = 4
  epochs = 3
  seed   = 1
}

trainer "pytorch" {
  file = "examples/pytorch/train.py" # relative to the run's working directory
}

averager "cpu" {
}
