#!/usr/bin/env bash
# A one-node SLURM cluster on this machine for tests/test_slurm.py: munge, slurmctld and
# slurmd (Debian's slurm-wlm), partitions `cpu` (default) and `gpu`, job completions
# recorded in a text file so `sacct --completion` lists them without a database.
# The node stands in for a cluster's nodes: it advertises (config_overrides; nothing is
# enforced) the CPUs and memory that profiles/slurm asks for, and two GPUs as generic
# resources backed by /dev/null and /dev/zero, so jobs asking `--gpus` are scheduled and their requests
# recorded. Finished jobs stay in `scontrol show job` for an hour (MinJobAge).
# Needs root; idempotent (a changed configuration restarts the daemons). Prints the job
# completion file's path.
set -euo pipefail
state=${SLURM_TEST_STATE:-/tmp/omicsprep_slurm}
host=$(hostname -s)
mkdir -p "$state"/{spool,state,log} /etc/slurm /etc/munge /run/munge /var/log/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged --force
# What one job of the profile may ask for (cluster: 8 threads; memory doubled by the
# first of two retries, 64 GB * 2 for cluster), not what this machine has.
cpus=16
memory=262144
old_conf=$(cat /etc/slurm/slurm.conf /etc/slurm/gres.conf 2>/dev/null || true)
cat > /etc/slurm/gres.conf <<CONF
AutoDetect=off
NodeName=$host Name=gpu File=/dev/null
NodeName=$host Name=gpu File=/dev/zero
CONF
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=omicsprep
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state/state
SlurmdSpoolDir=$state/spool
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobCompType=jobcomp/filetxt
JobCompLoc=$state/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SlurmdParameters=config_overrides
MinJobAge=3600
GresTypes=gpu
NodeName=$host CPUs=$cpus RealMemory=$memory Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
CONF
if [ "$old_conf" != "$(cat /etc/slurm/slurm.conf /etc/slurm/gres.conf)" ]; then
  for daemon in slurmd slurmctld; do
    pid=$(cat "$state/$daemon.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || continue
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
  done
fi
for daemon in slurmctld slurmd; do
  pgrep -x $daemon >/dev/null || /usr/sbin/$daemon || { echo "$daemon did not start; see $state/log" >&2; exit 1; }
done
for _ in $(seq 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo -h -o %T | grep -q idle || { echo "slurm did not come up; see $state/log" >&2; exit 1; }
echo "$state/jobcomp.txt"
