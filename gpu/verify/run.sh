#!/bin/bash
# gpu/verify/run.sh - everything docs/gpu.md verifies on a GPU host, in one
# go, from the repository root:
#
#   1. the probe capd-gpuinfo built against the CUDA runtime (standalone
#      CMake of gpu/, and plain gcc), run with the GPU visible and hidden;
#   2. the runner's GPU path without capd (gpu/verify/runner_check.py);
#   3. capd itself (built from Debian's -dev packages unpacked from .debs/
#      when the host has no package registry), a GPU job for a control and a
#      TF32 head build, and the comparison (gpu/verify/capd_job.py);
#   4. the same capd under its default limits (but run_as_user and
#      max_parallel) running examples/models, and the host's timm and
#      transformers models, at every CPU width and on the GPU, forward and
#      backward, twice, and the A/A comparison (gpu/verify/models_job.py);
#   5. perf verdicts: GPU cells at the default options judged on device time,
#      an A/A head and a head slowed on the device, whose profiled pair names
#      the slowed module (gpu/verify/perf_gpu.py; PERF_GPU=0 skips it); then,
#      unless PERF_CPU_BENCH=0, bench/bench_perf_verdicts.py on the host's CPUs at
#      capd's defaults (PERF_AA comparisons, default 3).
#
#   6. GPU cells sharing one device: the same two numerics-only GPU jobs
#      (16 cells, gpu/verify/share_job.py) under gpu_cells_per_device 1 (one cell at a
#      time, the placement before sharing) and under capd's default, on one
#      data dir; the wall-time ratio and every cell identical between them.
#
#   gpu/verify/run.sh RESULTS_DIR [STAGES]      STAGES: default "1 2 3"
#
# Stages 3 to 5 need capd's build dependencies: installed, or as Debian .debs in
# .debs/ (gpu/verify/fetch-debs.sh downloads them on a Debian machine).
# Nothing is installed system-wide: packages are unpacked under /tmp/deps.
set -u
RES=${1:?results dir}
STAGES=${2:-1 2 3}
mkdir -p "$RES"
ROOT=$(pwd)
PY=$(command -v python3)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
CUDA=${CUDA_HOME:-$( [ -n "$NVCC" ] && dirname "$(dirname "$(readlink -f "$NVCC")")" || echo /usr/local/cuda)}
JOBS=$(nproc)

{
    echo "## host"
    grep -E '^(PRETTY_NAME)=' /etc/os-release
    ldd --version | head -1
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv 2>&1
    echo "nvcc: $NVCC ($CUDA)"; "$NVCC" --version 2>&1 | tail -2
    echo "python3: $PY"
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
    command -v pkg-config cmake gcc dpkg curl
} >"$RES/host.txt" 2>&1
cat "$RES/host.txt"

if [[ " $STAGES " == *" 1 "* ]]; then
    echo "## stage 1: capd-gpuinfo (CUDA runtime through gpu/hip_cuda_compat.h)"
    cmake -S gpu -B /tmp/capd-gpu -DCAPD_GPU_CUDA=ON -DCUDAToolkit_ROOT="$CUDA" >"$RES/probe-cmake.log" 2>&1 &&
        cmake --build /tmp/capd-gpu -j"$JOBS" >>"$RES/probe-cmake.log" 2>&1
    echo "cmake build: rc=$?"; grep -E 'capd-gpuinfo|warning|error' "$RES/probe-cmake.log" | head -20
    gcc -std=c11 -O2 -Wall -Wextra -Wshadow -DCAPD_GPU_CUDA -I. -I"$CUDA/include" gpu/gpuinfo.c \
        -L"$CUDA/lib64" -lcudart -o /tmp/capd-gpuinfo-gcc 2>&1 | head -20
    echo "gcc build: rc=${PIPESTATUS[0]}"
    /tmp/capd-gpu/capd-gpuinfo >"$RES/gpuinfo.json"; echo "probe rc=$?"
    cat "$RES/gpuinfo.json"
    CUDA_VISIBLE_DEVICES= /tmp/capd-gpu/capd-gpuinfo >"$RES/gpuinfo-hidden.json"; echo "probe (CUDA_VISIBLE_DEVICES empty) rc=$?"
    cat "$RES/gpuinfo-hidden.json"
    LD_LIBRARY_PATH="$CUDA/lib64:${LD_LIBRARY_PATH:-}" /tmp/capd-gpuinfo-gcc >"$RES/gpuinfo-gcc.json"; echo "gcc-built probe rc=$?"
    # The address-space cap capd puts on CPU cells would break CUDA's
    # initialization; GPU cells run without it (daemon/attempt/sup.c).
    "$PY" - >"$RES/rlimit-as.txt" 2>&1 <<'EOF'
import resource, subprocess, sys
code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30)); "
        "import torch; torch.zeros(1, device='cuda'); print('cuda init under a 16 GiB RLIMIT_AS: ok')")
r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print("rc", r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:] )
EOF
    cat "$RES/rlimit-as.txt"
fi

if [[ " $STAGES " == *" 2 "* ]]; then
    echo "## stage 2: the runner's GPU path (runner_check.py)"
    PYTHONUNBUFFERED=1 timeout 240 "$PY" gpu/verify/runner_check.py "$RES/runner" 2>&1 | tee "$RES/runner.log"
fi

# capd's build dependencies: installed, or unpacked from .debs/ under
# /tmp/deps (sets EXTRA and RUNLIB); then capd, capd-exec, capd-gpuinfo.
build_capd() {
    D=/tmp/deps
    # Built by an earlier stage or call on this machine: its libraries are
    # still where that build unpacked them.
    if [ -x /tmp/capd-build/capd ]; then
        [ -d "$D/usr/lib/x86_64-linux-gnu" ] && RUNLIB="$D/usr/lib/x86_64-linux-gnu"
        return 0
    fi
    mkdir -p "$D/pc"
    if ls .debs/*.deb >/dev/null 2>&1; then
        for f in .debs/*.deb; do
            dpkg -x "$f" "$D" 2>/dev/null || "$PY" gpu/verify/undeb.py "$f" "$D"
        done
        LIB="$D/usr/lib/x86_64-linux-gnu"
        # pkg-config files of our own: the unpacked ones name /usr.
        pc() { printf 'Name: %s\nDescription: %s\nVersion: %s\nCflags: -I%s/usr/include\nLibs: -L%s -l%s\n' \
            "$1" "$1" "$2" "$D" "$LIB" "$3" >"$D/pc/$1.pc"; }
        pc libmicrohttpd 0.9.75 microhttpd; pc jansson 2.14 jansson; pc sqlite3 3.40.1 sqlite3
        pc libuv 1.44.2 uv; pc libzstd 1.5.4 zstd; pc libxxhash 0.8.1 xxhash; pc libcurl 7.88.1 curl
        PKGC=$(command -v pkg-config || true)
        if [ -z "$PKGC" ]; then
            printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/usr/bin/pkgconf "$@"\n' "$LIB" "$D" >"$D/pkg-config"
            chmod +x "$D/pkg-config"; PKGC="$D/pkg-config"
        fi
        EXTRA=(-DPKG_CONFIG_EXECUTABLE="$PKGC" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$LIB")
        export PKG_CONFIG_PATH="$D/pc" PKG_CONFIG_LIBDIR="$D/pc"
        RUNLIB="$LIB"
    else
        EXTRA=(); RUNLIB=""
    fi
    cmake -S . -B /tmp/capd-build -DCAPD_TESTS=OFF -DCAPD_WERROR=OFF -DCAPD_GPU_CUDA=ON \
        -DCUDAToolkit_ROOT="$CUDA" "${EXTRA[@]}" >"$RES/capd-cmake.log" 2>&1 &&
        cmake --build /tmp/capd-build -j"$JOBS" --target capd capd-exec capd-gpuinfo >>"$RES/capd-cmake.log" 2>&1
    rc=$?
    echo "capd build: rc=$rc"; grep -E 'error|capd-gpuinfo:' "$RES/capd-cmake.log" | head -20
    return $rc
}

# Starts capd with the config file $1 on a fresh data dir; CAPD is its pid.
start_capd() {
    rm -rf /tmp/capd-data
    LD_LIBRARY_PATH="$RUNLIB${RUNLIB:+:}${LD_LIBRARY_PATH:-}" /tmp/capd-build/capd \
        --config "$1" --data-dir /tmp/capd-data --listen 127.0.0.1:8470 \
        >"$RES/$2.out" 2>"$RES/$2.log" &
    CAPD=$!
    for _ in $(seq 100); do grep -q listening "$RES/$2.out" && break; sleep 0.1; done
    cat "$RES/$2.out"
}

RUNLIB=""
if [[ " $STAGES " == *" 3 "* ]]; then
    echo "## stage 3: capd with a GPU job"
    if build_capd; then
        # Cells as root on this throw-away GPU host, on purpose: capd refuses
        # run_as_user "" as root without allow_root_cells.
        printf '{"run_as_user": "", "allow_root_cells": true, "max_parallel": 2, "gpuinfo_timeout_ms": 60000}\n' >/tmp/capd.json
        start_capd /tmp/capd.json capd
        LD_LIBRARY_PATH_FOR_CELLS="${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1 timeout 240 \
            "$PY" gpu/verify/capd_job.py --python "$PY" --data-dir /tmp/capd-data "$RES/capd" 2>&1 | tee "$RES/capd_job.log"
        kill -TERM "$CAPD"; sleep 1
        grep -E 'gpu_probe|cell_device|cell_finished|error' "$RES/capd.log" | head -40
    fi
fi

if [[ " $STAGES " == *" 4 "* ]]; then
    echo "## stage 4: third-party model code under the default limits, A/A (models_job.py)"
    if build_capd; then
        # The defaults but for who runs the cells and how many at once.
        printf '{"run_as_user": "", "allow_root_cells": true, "max_parallel": %s, "gpuinfo_timeout_ms": 60000}\n' \
            "${MODELS_PARALLEL:-6}" >/tmp/capd-models.json
        start_capd /tmp/capd-models.json capd-models
        curl -s http://127.0.0.1:8470/v1/host >"$RES/models-host.json" 2>/dev/null
        LD_LIBRARY_PATH_FOR_CELLS="${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1 timeout "${MODELS_TIMEOUT:-420}" \
            "$PY" gpu/verify/models_job.py --python "$PY" --data-dir /tmp/capd-data \
            --model-root "$ROOT/examples/models" "$RES/models" 2>&1 | tee "$RES/models_job.log"
        kill -TERM "$CAPD"; sleep 1
        grep -E 'memory|cgroup|watchdog' "$RES/capd-models.log" | head -10
    fi
fi

if [[ " $STAGES " == *" 5 "* ]]; then
    echo "## stage 5: perf verdicts, GPU cells on device time (perf_gpu.py) and the CPU benchmark"
    if build_capd; then
        printf '{"run_as_user": "", "allow_root_cells": true, "gpuinfo_timeout_ms": 60000}\n' >/tmp/capd-perf.json
        if [ "${PERF_GPU:-1}" != 0 ]; then
            start_capd /tmp/capd-perf.json capd-perf
            LD_LIBRARY_PATH_FOR_CELLS="${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1 timeout "${PERF_GPU_TIMEOUT:-300}" \
                "$PY" gpu/verify/perf_gpu.py --python "$PY" --data-dir /tmp/capd-data "$RES/perf-gpu" 2>&1 |
                tee "$RES/perf_gpu.log"
            kill -TERM "$CAPD"; sleep 1
        fi
        if [ "${PERF_CPU_BENCH:-1}" != 0 ]; then
            # The defaults but for who runs the cells (root, on this throw-away
            # host) and cells in parallel, as issue 35 measures this host's CPU
            # (PERF_MAX_PARALLEL, default 4; 1 is capd's own default).
            printf '{"run_as_user": "", "allow_root_cells": true, "max_parallel": %d}\n' \
                "${PERF_MAX_PARALLEL:-4}" >/tmp/capd-bench.json
            echo "load before: $(cat /proc/loadavg)"
            LD_LIBRARY_PATH="$RUNLIB${RUNLIB:+:}${LD_LIBRARY_PATH:-}" CAPD_BENCH_CONFIG=/tmp/capd-bench.json \
                PYTHONUNBUFFERED=1 timeout "${PERF_CPU_TIMEOUT:-420}" "$PY" bench/bench_perf_verdicts.py \
                --capd /tmp/capd-build/capd --python "$PY" --aa "${PERF_AA:-3}" --out "$RES/perf-cpu.json" \
                --keep-db "$RES/perf-cpu.db" 2>&1 |
                tail -40
            echo "load after: $(cat /proc/loadavg)"
        fi
    fi
fi

if [[ " $STAGES " == *" 6 "* ]]; then
    echo "## stage 6: GPU cells sharing one device (share_job.py)"
    if build_capd; then
        rm -rf /tmp/capd-data
        for per in 1 default; do
            extra=""
            [ "$per" = default ] || extra=", \"gpu_cells_per_device\": $per"
            printf '{"run_as_user": "", "allow_root_cells": true, "max_parallel": 8, "gpuinfo_timeout_ms": 60000%s}\n' \
                "$extra" >/tmp/capd-share.json
            LD_LIBRARY_PATH="$RUNLIB${RUNLIB:+:}${LD_LIBRARY_PATH:-}" /tmp/capd-build/capd \
                --config /tmp/capd-share.json --data-dir /tmp/capd-data --listen 127.0.0.1:8470 \
                >"$RES/capd-share-$per.out" 2>"$RES/capd-share-$per.log" &
            CAPD=$!
            for _ in $(seq 100); do grep -q listening "$RES/capd-share-$per.out" && break; sleep 0.1; done
            LD_LIBRARY_PATH_FOR_CELLS="${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1 timeout "${SHARE_TIMEOUT:-300}" \
                "$PY" gpu/verify/share_job.py --python "$PY" --data-dir /tmp/capd-data \
                --tag "per-$per" "$RES/share" 2>&1 | tee -a "$RES/share_job.log"
            if [ "$per" = default ]; then
                "$PY" gpu/verify/share_job.py --python "$PY" --data-dir /tmp/capd-data \
                    --judge per-1 per-default "$RES/share" 2>&1 | tee -a "$RES/share_job.log"
            fi
            kill -TERM "$CAPD"; wait "$CAPD" 2>/dev/null
        done
        grep -E 'cell_device|gpu_oom|error' "$RES"/capd-share-*.log | head -20
    fi
fi
