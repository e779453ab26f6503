#!/usr/bin/env bash
# A one-node SLURM cluster on this machine for tests/test_slurm.py: munge, slurmctld and
# slurmd (Debian's slurm-wlm), partitions `cpu` (default) and `gpu`, job completions
# recorded in a text file so `sacct --completion` lists them without a database.
# Needs root; idempotent. Prints the job completion file's path.
set -euo pipefail
state=${SLURM_TEST_STATE:-/tmp/omicsprep_slurm}
host=$(hostname -s)
mkdir -p "$state"/{spool,state,log} /etc/slurm /etc/munge /run/munge /var/log/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged --force
cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
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
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
CONF
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo -h -o %T | grep -q idle || { echo "slurm did not come up; see $state/log" >&2; exit 1; }
echo "$state/jobcomp.txt"
