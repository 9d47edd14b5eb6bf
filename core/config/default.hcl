# cohort's built-in configuration: what `cohort run` uses without a file, and
# the value of every key a file leaves out.

run {
  ranks  = 4             # rank workers
  epochs = 3
  seed   = 1
  out    = "runs/latest" # checkpoints and metrics; relative to the working directory
}

coordinator {
  listen            = "127.0.0.1:0" # control server, host:port (port 0: any free port)
  reduce_port       = 0             # the reduce server's port, on listen's host (0: any free port)
  http              = "127.0.0.1:0" # status page, /api/v1/status, /metrics; loopback unless set; "": none
  heartbeat_timeout = "30s"         # rank silence that declares it dead (at least 1s)
  formation_timeout = "60s"         # how long to wait for every rank to join
  policy            = "sync"        # sync | cadence | async
  sync_every        = 10            # batches between averaging rounds, for sync
  min_ranks         = 1             # fewest live ranks that may carry on
  checkpoint_every  = 1             # epochs between checkpoints; 0: only on Ctrl-C and failures
  checkpoint_keep   = 3             # the newest checkpoints kept; 0: all
  eval_rank         = "lowest"      # who evaluates and runs the epoch callback: lowest (live rank) |
                                    # fastest (lowest batch time; moves for a 10% faster rank) | a rank number ("2")
  eval_every        = 1             # epochs between evaluations; 0: never (else the last epoch always is)
  chunk_batches     = 0             # progressive dispatch chunk; 0: the policy's default
  overhead_target   = 0.1           # cadence: grow the window when sync overhead exceeds it
  easgd_alpha       = 0.5           # async: elastic averaging strength
  async_overlap     = true          # async: rounds run beside training where the trainer can
  adaptive_sync     = true          # sync, async: the ranks' divergence moves the interval
  sync_every_min    = 1             #   between these bounds (max 0: sync_every, so it only tightens),
  sync_every_max    = 0
  divergence_target = 0             #   aiming at this distance of a rank from the average
                                    #   (0: 0.05, or 0.01 where the trainer's optimizer is adaptive: Adam…)
  guard_factor      = 3             # a divergence spike (this × its running mean; 0: off) drops
  guard_lr_factor   = 0.5           #   the interval to its minimum and scales the rate by this
  lr_plateau_patience = 0           # epochs without a better eval loss before the rate
  lr_plateau_factor   = 0.5         #   is scaled by this (0: no plateau rule)
  max_batch_diff    = 0             # async: batches a rank may run ahead before it is throttled;
                                    # cadence: most a rank's window moves per window (0: off)
  # tls {                           # mutual TLS 1.3 on the control and reduce servers;
  #   ca   = "tls/ca.pem"           # ranks must present a certificate from this CA
  #   cert = "tls/head.pem"         # (`cohort tls init` makes the files; relative
  #   key  = "tls/head-key.pem"     # paths are beside this file)
  # }
}

worker {
  liveness_timeout = "30s"          # coordinator silence that ends the worker
  connect_timeout  = "30s"
  plugin_dir       = "bin/plugins"
  shutdown_grace   = "5s"
  plugin_lock      = "cohort.lock.json" # checksums `cohort plugins install` accepted; "" for none
  plugin_restarts  = 3              # plugins a rank may replace after they die or wedge; past that it dies
  # tls {                          # mutual TLS to the coordinator and, through the
  #   ca   = "tls/ca.pem"          # averager, to the reduce server: the coordinator's
  #   cert = "tls/node1.pem"       # certificate must chain to ca and name the host
  #   key  = "tls/node1-key.pem"   # dialled; this one is the worker's own
  # }
}

# A plugin block's body is the plugin's own settings, passed to it as JSON,
# but for one key the core takes: version = ">= 1.2, < 2" refuses a plugin
# whose own version (from its Describe) is outside the constraint.

trainer "libtorch" {
  model = "mlp"
}

averager "cpu" {
}
