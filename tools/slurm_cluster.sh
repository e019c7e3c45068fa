#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for sweep.py's SLURM launcher and its tests: munge, MariaDB and
# slurmdbd (the job accounting sacct reads, and submitit reads job states from), slurmctld and slurmd, every file and
# socket in one folder and every port private, so nothing under /etc changes and a system SLURM is left alone.
#
#   bash tools/slurm_cluster.sh install        # as root: Debian's slurm-wlm, munge, slurmdbd, mariadb-server
#   bash tools/slurm_cluster.sh start [DIR]    # DIR: default /tmp/nanope-slurm; then export SLURM_CONF=DIR/slurm.conf
#   bash tools/slurm_cluster.sh stop [DIR]     # each daemon by its pid file
#   bash tools/slurm_cluster.sh status [DIR]
#
# sbatch, squeue, sacct and scontrol find the cluster through SLURM_CONF (start prints the line). Daemons run as root
# (no systemd, no cgroups: proctrack/linuxproc). One partition, `debug`, of this machine's cores, no GPUs. Ports:
# SLURM_PORT_BASE (default 16817) for slurmctld, +1 slurmd, +2 slurmdbd, +3 MariaDB.
set -euo pipefail
CMD=${1:-}
DIR=$(realpath -m "${2:-${SLURM_DIR:-/tmp/nanope-slurm}}")
BASE=${SLURM_PORT_BASE:-16817}
# a requeued job waits cred_expire seconds before it starts again (SLURM's default: 120)
CRED_EXPIRE=${SLURM_CRED_EXPIRE:-5}
export SLURM_CONF=$DIR/slurm.conf
DAEMONS="slurmd slurmctld slurmdbd mysqld munged"  # stop order

alive() { [ -f "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

wait_for() {  # SECONDS WHAT COMMAND...: retry COMMAND until it succeeds, or fail naming WHAT and its log
    local end=$((SECONDS + $1)) what=$2
    shift 2
    while [ $SECONDS -lt $end ]; do
        timeout 10 "$@" > /dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "slurm_cluster: $what did not come up in time; see $DIR/log/" >&2
    exit 1
}

case "$CMD" in
install)
    if [ "$(id -u)" != 0 ]; then
        echo "slurm_cluster: install needs root (apt-get install slurm-wlm munge slurmdbd mariadb-server)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    policy=/usr/sbin/policy-rc.d  # no system service starts at install: `start` runs the daemons, each its own
    if [ ! -e $policy ]; then
        printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy && trap 'rm -f $policy' EXIT
    fi
    apt-get update -qq && apt-get install -y -qq slurm-wlm munge slurmdbd mariadb-server > /dev/null
    echo "slurm_cluster: installed $(dpkg-query -W -f '${Package} ${Version}  ' slurm-wlm munge slurmdbd mariadb-server)"
    ;;
start)
    missing=$(for b in munged slurmctld slurmd slurmdbd sacctmgr mariadbd mariadb-install-db; do
        command -v "$b" > /dev/null || command -v "/usr/sbin/$b" > /dev/null || echo -n "$b "; done)
    if [ -n "$missing" ]; then
        echo "slurm_cluster: missing ${missing}: apt-get install slurm-wlm munge slurmdbd mariadb-server" \
             "(bash tools/slurm_cluster.sh install)" >&2
        exit 3
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "slurm_cluster: the daemons run as root (slurmd starts jobs as their user); run as root" >&2
        exit 3
    fi
    PATH=$PATH:/usr/sbin
    if alive slurmctld && alive slurmd; then
        echo "slurm_cluster: already running in $DIR; export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    mkdir -p "$DIR"/{log,state,spool,munge,munge-key,mysql-run}
    chmod 755 "$DIR" "$DIR/munge"  # munged wants its socket's folders searchable by all, its key's by root only
    chmod 700 "$DIR/munge-key"
    host=$(hostname -s)
    cpus=$(getconf _NPROCESSORS_ONLN)  # (nproc would count OMP_NUM_THREADS)
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
    socket=$DIR/munge/munge.socket.2
    pass=nanope-local  # the database listens on 127.0.0.1 only, for this cluster's slurmdbd
    # 1. munge: its own key and socket
    key=$DIR/munge-key/munge.key
    [ -f "$key" ] || { head -c 1024 /dev/urandom > "$key"; chmod 400 "$key"; }
    alive munged || munged --force --socket="$socket" --key-file="$key" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge-key/munged.seed" \
        2> "$DIR/log/munged.err"
    wait_for 10 munged bash -c "munge -S '$socket' -n | unmunge -S '$socket'"
    # 2. MariaDB (a database of its own) and slurmdbd
    if [ ! -d "$DIR/mysql/mysql" ]; then
        mariadb-install-db --user=root --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
            --skip-test-db > "$DIR/log/mariadb-install.log" 2>&1
    fi
    alive mysqld || (mariadbd --user=root --datadir="$DIR/mysql" --socket="$DIR/mysql-run/mysqld.sock" \
        --port=$((BASE + 3)) --bind-address=127.0.0.1 --pid-file="$DIR/mysqld.pid" --skip-name-resolve \
        --log-error="$DIR/log/mariadb.log" > /dev/null 2>&1 &)
    wait_for 30 MariaDB mysql --socket="$DIR/mysql-run/mysqld.sock" -uroot -e 'SELECT 1'
    mysql --socket="$DIR/mysql-run/mysqld.sock" -uroot -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
    cat > "$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((BASE + 2))
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((BASE + 3))
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/slurmdbd.pid
EOF
    chmod 600 "$DIR/slurmdbd.conf"
    # 3. slurm.conf: one node of this machine's cores, accounting through slurmdbd
    cat > "$SLURM_CONF" <<EOF
ClusterName=nanope
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$BASE
SlurmdPort=$((BASE + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket,cred_expire=$CRED_EXPIRE
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SchedulerParameters=sched_interval=1
MinJobAge=3600
KillWait=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((BASE + 2))
AccountingStoragePass=$socket
JobAcctGatherType=jobacct_gather/linux
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    alive slurmdbd || slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
    sacctmgr -i add cluster nanope > /dev/null 2>&1 || true
    alive slurmctld || slurmctld
    alive slurmd || slurmd
    wait_for 30 'the node' bash -c "sinfo -h -o %t | grep -qvE '^(unk|down|drain|fail|boot)'"
    echo "slurm_cluster: running in $DIR (partition debug, $cpus CPUs); export SLURM_CONF=$SLURM_CONF"
    ;;
stop)
    if alive slurmctld; then  # no job left running on past its cluster: cancel them, wait for their steps to end
        scancel --full --quiet --partition=debug 2> /dev/null || true
        for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2> /dev/null)" ] && break; sleep 0.5; done
    fi
    for d in $DAEMONS; do
        if alive "$d"; then
            pid=$(cat "$DIR/$d.pid")
            kill "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$DIR/$d.pid"
    done
    echo "slurm_cluster: stopped ($DIR kept; rm -rf it for a fresh cluster)"
    ;;
status)
    for d in $DAEMONS; do
        if alive "$d"; then echo "$d: running (pid $(cat "$DIR/$d.pid"))"; else echo "$d: not running"; fi
    done
    alive slurmctld && sinfo && squeue
    ;;
*)
    echo "usage: bash tools/slurm_cluster.sh install | start [DIR] | stop [DIR] | status [DIR]" >&2
    exit 2
    ;;
esac
