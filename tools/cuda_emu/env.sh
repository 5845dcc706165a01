# env.sh - what the run*.sh scripts share (sourced after set -e): R the repository, E this folder,
# O the build folder ($BUILD/cuda_emu, created), CUDA_INC the toolkit's headers.
R=$(cd "$(dirname "$0")/../.." && pwd)
E="$R/tools/cuda_emu"
O="$R/${BUILD:-build}/cuda_emu"
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
mkdir -p "$O"
