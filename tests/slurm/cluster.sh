#!/bin/sh
# A one-node Slurm cluster under one directory, for the tests (README.md).
#   cluster.sh up DIR    munged, slurmctld and slurmd under DIR; DIR/env
#   cluster.sh down DIR  stops them by their pid files; safe to run twice
#   cluster.sh crash-node DIR   the node dies: slurmd, its slurmstepds and
#                        their jobs killed -9 (slurmctld marks the node DOWN
#                        after SlurmdTimeout, its jobs NODE_FAIL)
#   cluster.sh start-node DIR   slurmd again (the node returns: ReturnToService=2)
# `up` exits 77 (the tests' skip) and says why when this host cannot run it.
set -eu

# The node features are the CPU flags capd's widths require
# (schema/widths.json) plus the ones a wider width may need next
# (bf16, VNNI, AMX), in /proc/cpuinfo's spelling.
FEATURES_WANTED="avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16 avx512_vnni amx_tile amx_bf16"

usage() {
    echo "usage: $0 up|down|crash-node|start-node DIR" >&2
    exit 2
}

skip() {
    echo "cluster.sh: cannot run a Slurm cluster here: $*" >&2
    exit 77
}

# A port the kernel gives out from its ephemeral range and that nothing
# listens on at the moment.
free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# CAPD_SLURM_FEATURES_HIDE (space-separated) leaves flags this CPU has off
# the node, so a test can make a width no node offers on any host.
features() {
    have=$(sed -n 's/^flags[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n1)
    out=""
    for f in $FEATURES_WANTED; do
        case " ${CAPD_SLURM_FEATURES_HIDE:-} " in *" $f "*) continue ;; esac
        case " $have " in *" $f "*) out="${out:+$out,}$f" ;; esac
    done
    echo "$out"
}

tails() {
    for f in "$DIR"/munged.log "$DIR"/slurmctld.log "$DIR"/slurmd.log; do
        [ -f "$f" ] || continue
        echo "--- last lines of $f" >&2
        tail -n 15 "$f" >&2
    done
}

up() {
    [ "$(id -u)" -eq 0 ] || skip "not root (slurmd must run as root)"
    for b in munged slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
        command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] ||
            skip "$b is missing (scripts/install-deps.sh installs slurm-wlm and munge)"
    done
    PATH="$PATH:/usr/sbin"
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    mkdir -p "$DIR/munge" "$DIR/spool/ctld" "$DIR/spool/d"
    chmod 0700 "$DIR/munge"
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 2>/dev/null
    chmod 0400 "$DIR/munge/munge.key"
    munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" \
        --seed-file="$DIR/munge/munge.seed" --force ||
        { tails; echo "cluster.sh: munged did not start" >&2; exit 1; }
    node=$(hostname -s)
    ctld_port=$(free_port)
    d_port=$(free_port)
    while [ "$d_port" = "$ctld_port" ]; do d_port=$(free_port); done
    feat=$(features)
    # what slurmd finds, less a tenth (it drains a node that claims more)
    mem_mb=$(awk '/^MemTotal:/ { print int($2 / 1024 * 0.9) }' /proc/meminfo)
    cat >"$DIR/slurm.conf" <<CONF
ClusterName=capdtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
MinJobAge=3600
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=10
InactiveLimit=0
KillWait=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem_mb ${feat:+Feature=$feat} State=UNKNOWN
PartitionName=capd Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
    SLURM_CONF="$DIR/slurm.conf"
    export SLURM_CONF
    slurmctld -i || { tails; echo "cluster.sh: slurmctld did not start" >&2; exit 1; }
    slurmd || { tails; echo "cluster.sh: slurmd did not start" >&2; exit 1; }
    # sinfo answers within a few seconds on an idle host; 30 s is the bound.
    i=0
    while :; do
        st=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
        [ "$st" = "idle" ] && break
        i=$((i + 1))
        if [ "$i" -ge 60 ]; then
            echo "cluster.sh: node $node not idle after 30 s (sinfo: '${st}')" >&2
            tails
            exit 1
        fi
        sleep 0.5
    done
    echo "SLURM_CONF=$DIR/slurm.conf" >"$DIR/env"
    echo "cluster.sh: up under $DIR (node $node, ports $ctld_port/$d_port, features '${feat}')"
}

# Stops the process named by pid file $1 if it is still the program $2:
# TERM, then KILL after 5 s.
stop_pid() {
    [ -f "$1" ] || return 0
    pid=$(cat "$1" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) rm -f "$1"; return 0 ;; esac
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    if [ "$comm" = "$2" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        i=0
        while [ -d "/proc/$pid" ] && [ "$i" -lt 50 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

down() {
    [ -d "$DIR" ] || return 0
    PATH="$PATH:/usr/sbin"
    # The jobs go first, so no slurmstepd outlives its slurmd.
    if [ -f "$DIR/slurmctld.pid" ] && [ -f "$DIR/slurm.conf" ]; then
        SLURM_CONF="$DIR/slurm.conf" timeout 10 scancel --user=root >/dev/null 2>&1 || true
    fi
    stop_pid "$DIR/slurmd.pid" slurmd
    # what scancel could not reach (the controller already gone): the
    # node's slurmstepds and their jobs
    [ -f "$DIR/slurm.conf" ] && sweep_node
    stop_pid "$DIR/slurmctld.pid" slurmctld
    stop_pid "$DIR/munged.pid" munged
}

# Every process of this cluster's node: slurmd, and whatever runs with its
# SLURM_CONF (its slurmstepds and the jobs they started), but slurmctld and
# munged, which are the controller's host.
crash_node() {
    [ -f "$DIR/slurm.conf" ] || { echo "cluster.sh: no cluster under $DIR" >&2; exit 1; }
    [ -f "$DIR/slurmd.pid" ] && kill -KILL "$(cat "$DIR/slurmd.pid")" 2>/dev/null || true
    rm -f "$DIR/slurmd.pid"
    sweep_node
}

# Kills -9 every process with this cluster's SLURM_CONF in its environment
# but slurmctld and munged (and this shell).
sweep_node() {
    ctld=$(cat "$DIR/slurmctld.pid" 2>/dev/null || true)
    munge=$(cat "$DIR/munged.pid" 2>/dev/null || true)
    for e in /proc/[0-9]*/environ; do
        pid=${e#/proc/}
        pid=${pid%/environ}
        [ "$pid" = "$$" ] || [ "$pid" = "$ctld" ] || [ "$pid" = "$munge" ] && continue
        if tr '\0' '\n' 2>/dev/null <"$e" | grep -qx "SLURM_CONF=$DIR/slurm.conf"; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}

start_node() {
    PATH="$PATH:/usr/sbin"
    SLURM_CONF="$DIR/slurm.conf" slurmd || { tails; echo "cluster.sh: slurmd did not start" >&2; exit 1; }
}

[ $# -eq 2 ] || usage
DIR=$2
case "$1" in
up) up ;;
down) down ;;
crash-node) crash_node ;;
start-node) start_node ;;
*) usage ;;
esac
