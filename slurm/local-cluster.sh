#!/usr/bin/env bash
# A two-node Slurm cluster on this machine, for tests and CI (no systemd needed).
#   bash slurm/local-cluster.sh up     # install slurm-wlm + munge if missing, start munged, slurmctld, 2 slurmd
#   bash slurm/local-cluster.sh down
# Nodes n1 and n2 are two slurmd processes on 127.0.0.1 (own ports, /etc/hosts entries); each
# reports this machine's CPUs. Inside a task, $SLURMD_NODENAME tells them apart (hostname does not).
# Prints `export SLURM_CONF=...` on success; the same path is used by the tests.
# Only daemons this script started (their pid files under $STATE) are ever stopped: a machine that
# already runs a Slurm of its own is left alone, and `up` refuses to start a second one beside it.
set -euo pipefail
STATE=${PRORES_SLURM_DIR:-/tmp/prores-slurm}
export SLURM_CONF=$STATE/slurm.conf
OURS=("$STATE/slurmd-n1.pid" "$STATE/slurmd-n2.pid" "$STATE/slurmctld.pid" "$STATE/munged.pid")

live() {  # pids of running (not zombie) processes named $1, comma-separated names allowed
  ps -C "$1" -o pid=,stat= | awk '$2 !~ /^Z/ {print $1}'
}

down() {
  local pidfile pid
  for pidfile in "${OURS[@]}"; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do  # gone, or a zombie nobody reaps
      kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ] || break
      sleep 0.1
    done
    rm -f "$pidfile"
  done
}

foreign() {  # a running slurmctld/slurmd that is not ours
  local pid
  for pid in $(live slurmctld,slurmd); do
    grep -qx "$pid" "${OURS[@]}" 2>/dev/null || { echo "$pid"; return 0; }
  done
  return 1
}

up() {
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >&2
  fi
  down
  if pid=$(foreign); then
    echo "a Slurm daemon this script did not start is running (pid $pid): not starting a second one" >&2
    return 1
  fi
  mkdir -p "$STATE/spool/n1" "$STATE/spool/n2" "$STATE/state" /run/munge /var/log/munge /var/lib/munge /etc/munge
  for n in n1 n2; do
    grep -qE "^127\.0\.0\.1[[:space:]].*\b$n\b" /etc/hosts || echo "127.0.0.1 $n" >> /etc/hosts
  done
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  chmod 0700 /etc/munge /var/log/munge /var/lib/munge
  chmod 0400 /etc/munge/munge.key
  chmod 0755 /run/munge
  if [ -z "$(live munged)" ]; then  # the machine's own munged, if any, serves us too
    runuser -u munge -- munged --force
    live munged > "$STATE/munged.pid"
  fi
  local cpus
  cpus=$(slurmd -C | head -n 1 | sed -e 's/NodeName=[^ ]* //' -e 's/ *UpTime=.*//')
  cat > "$SLURM_CONF" <<CONF
ClusterName=prores
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdSpoolDir=$STATE/spool/%n
StateSaveLocation=$STATE/state
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
NodeName=n1 NodeAddr=127.0.0.1 Port=17001 $cpus State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 Port=17002 $cpus State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  slurmctld -i
  slurmd -N n1
  slurmd -N n2
  for _ in $(seq 60); do
    if [ "$(sinfo -h -N -o %t 2>/dev/null | grep -cE '^(idle|mix|alloc)')" = 2 ]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.5
  done
  echo "slurm did not come up; see $STATE/*.log" >&2
  return 1
}

"${1:-up}"
