#!/bin/bash
# make slurm-check: a one-node Slurm cluster on this machine, as root, runs
# deploy/slurm/cohort.sbatch with 4 tasks and checks the run's summary.
# Debian's slurm-wlm and munge are installed when missing. The daemons run
# from a private directory (their own munge socket and key, ports, state)
# and are stopped, and the directory removed, however the check ends.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

if [ "$(id -u)" != 0 ]; then
  echo "slurm-check: needs root (it starts slurmctld and slurmd)" >&2
  exit 1
fi
for p in slurm-wlm munge; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
    break
  fi
done

work=$(mktemp -d /tmp/cohort-slurm-check.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# munge: a key and a socket of this check's own.
mkdir -p "$work/munge"
chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --foreground --force --socket="$work/munge/socket" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/pid" --log-file="$work/munge/log" --seed-file="$work/munge/seed" >"$work/munged.out" 2>&1 &
pids+=($!)

host=$(hostname -s)
cpus=$(nproc)
# Ports of this check's own, away from a site's 6817/6818.
ctld_port=$((20000 + RANDOM % 20000))
mkdir -p "$work/state" "$work/spool"
cat >"$work/slurm.conf" <<CONF
ClusterName=cohortcheck
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/slurmd.out" 2>&1 &
pids+=($!)

for i in $(seq 60); do
  if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix)'; then break; fi
  if [ "$i" = 60 ]; then
    echo "slurm-check: the node never came up" >&2
    tail -n 20 "$work/slurmctld.log" "$work/slurmd.log" >&2 || true
    exit 1
  fi
  sleep 1
done

cat >"$work/cohort.hcl" <<CONF
coordinator {
  sync_every       = 4
  checkpoint_every = 2
}
worker {
  plugin_dir = "$root/bin/plugins"
}
trainer "mock" {
  samples    = 1024
  batch_size = 16
}
averager "mock" {}
CONF

out=$work/run
start=$(date +%s.%N)
cd "$work"
sbatch --wait --ntasks 4 --overcommit --output "$work/job.out" \
  --export "ALL,COHORT=$root/bin/cohort,COHORT_CONFIG=$work/cohort.hcl,COHORT_OUT=$out" \
  "$root/deploy/slurm/cohort.sbatch" >/dev/null || {
  echo "slurm-check: the job failed; its output:" >&2
  cat "$work/job.out" >&2
  exit 1
}
end=$(date +%s.%N)
python3 - "$out/summary.json" "$start" "$end" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ok = s["status"] == "completed" and s["world_size"] == 4 and len(s["epochs"]) > 0 and all(r["state"] == "exited" for r in s["ranks"])
print(json.dumps({"check": "slurm", "ok": ok, "status": s["status"], "ranks": s["world_size"],
                  "epochs": len(s["epochs"]), "samples_per_epoch": [e["samples"] for e in s["epochs"]],
                  "rounds": s["averaging"]["rounds"], "wall_s": round(float(sys.argv[3]) - float(sys.argv[2]), 2)}))
sys.exit(0 if ok else 1)
PY
