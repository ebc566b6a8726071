# Sourced on the GPU machine before running packed binaries: finds the carried libraries.
export LD_LIBRARY_PATH="$(pwd)/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export SPECULA_SOURCE_DIR="$(pwd)"
export PATH="$(pwd)/.gpu/bin:$PATH"
