#!/usr/bin/env bash
# A private single-node Slurm cluster on loopback for the tests: munged, slurmctld and slurmd started
# under DIR (no systemd, nothing outside DIR touched), stopped by `cluster.sh stop DIR`.
#   cluster.sh start DIR    prints the SLURM_CONF to export once the node is idle
#   cluster.sh stop DIR
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop DIR} dir=${2:?usage: cluster.sh start|stop DIR}
die() { echo "cluster.sh: $*" >&2; exit 1; }

stop() {
  for d in slurmd slurmctld munged; do
    [[ -f $dir/$d.pid ]] && kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
  done
  sleep 1
  for d in slurmd slurmctld munged; do
    [[ -f $dir/$d.pid ]] && kill -9 "$(cat "$dir/$d.pid")" 2>/dev/null || true
    rm -f "$dir/$d.pid"
  done
}

if [[ $cmd == stop ]]; then stop; exit 0; fi
[[ $cmd == start ]] || die "unknown command $cmd"
for p in munged mungekey slurmctld slurmd sbatch; do
  command -v "$p" >/dev/null || [[ -x /usr/sbin/$p ]] || die "$p not found (Debian packages slurm-wlm and munge)"
done
export PATH=$PATH:/usr/sbin
mkdir -p "$dir"/{state,spool,munge}
dir=$(cd "$dir" && pwd)
chmod 700 "$dir/munge"
mungekey -c -f -k "$dir/munge/munge.key"
munged -f --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed"

# Free ports: two the kernel hands out now (a race with other programs is unlikely in a test).
read -r p1 p2 < <(python3 - <<'PY' 2>/dev/null || echo "$((20000 + RANDOM % 20000)) $((40000 + RANDOM % 20000))"
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])
PY
)
host=$(hostname -s)
user=$(id -un)
cat > "$dir/slurm.conf" <<CONF
ClusterName=kvbtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p1
SlurmdPort=$p2
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -i
slurmd
for _ in $(seq 60); do
  if sinfo -h -o %t 2>/dev/null | grep -qx idle; then echo "$SLURM_CONF"; exit 0; fi
  sleep 0.5
done
tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
die "the node did not come up within 30 s (logs above)"
