# Shared by scripts/demo and scripts/test: install what is missing, configure, build.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${REPLICA_BUILD_DIR:-$root/build}"

# Installs the Debian packages named that are not installed yet.
ensure_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

base_packages=(meson ninja-build pkg-config g++ python3 libopenblas-dev libdnnl-dev zlib1g-dev libopenmpi-dev openmpi-bin libcli11-dev)
# Image files (data::ImageFolder, the train_images example) and drawing the curves (scripts/plot-history).
image_packages=(libpng-dev libjpeg62-turbo-dev)
plot_packages=(python3-matplotlib)
# ONNX export (replica/onnx/) and its check: libonnx's protobuf types, Debian's onnx.checker.
onnx_packages=(libonnx-dev libprotobuf-dev python3-onnx)

# Node and npm, for ONNX Runtime from npm (tests/onnx/check.py): Debian's, unless a node is installed
# already (NodeSource's nodejs carries its own npm and conflicts with Debian's npm package).
ensure_node() {
    command -v node >/dev/null && command -v npm >/dev/null && return 0
    ensure_packages nodejs npm
}

# Whether this machine has an NVIDIA GPU the programs could use (nvidia-smi lists one, or the driver's
# device file exists).
gpu_visible() {
    { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; } || [ -e /dev/nvidia0 ]
}

# Configures the build folder once (again if meson.build changed: ninja does that itself).
configure() {
    if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" "$root" --buildtype=release "$@" >&2
    fi
}

# OpenBLAS 0.3.21 (Debian 12) does not know recent CPUs and falls back to its SSE3 kernels, several
# times slower. Name the kernels this CPU can run unless the user already chose.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512bw /proc/cpuinfo; then
        export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
        export OPENBLAS_CORETYPE=Haswell
    fi
fi
