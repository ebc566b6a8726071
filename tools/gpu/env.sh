# Sourced on the GPU machine before running packed binaries: unpacks them (pack.sh carries them
# compressed) and finds the carried libraries.
if [ ! -d .gpu/bin ] && [ -f .gpu/bin.tar.xz ]; then xz -dc .gpu/bin.tar.xz | tar -C .gpu -xf -; fi
export LD_LIBRARY_PATH="$(pwd)/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export SPECULA_SOURCE_DIR="$(pwd)"
export PATH="$(pwd)/.gpu/bin:$PATH"
# Tensor parallelism opens libnccl.so.2 at run time: the system's, else PyTorch's copy.
if ! ldconfig -p 2>/dev/null | grep -q "libnccl.so.2 "; then
  nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nccl")"
fi
# The benchmarks' prompts into file $1: this repository's Python as frozen in bench/datasets/python.txt
# (its README: the prompts drawn, and so the figures, must not move with every edit of the code).
prompt_dataset() { cp bench/datasets/python.txt "$1"; }
