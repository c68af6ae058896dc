#!/bin/bash
# Compile time (wall, one file at a time) and object size of each kernel file the head-dim work changed, with
# nvcc (the stage's own flags, fatbin uncompressed so that sizes compare) and for the emulator (g++, the
# emulated library's flags), in the tree given.
# usage: measure_compile.sh TREE TAG [WORK_DIR]   e.g. a checkout of the commit before, then of this one
tree=$(cd "$1" && pwd); tag=$2; work=${3:-/tmp/flashlab-compile}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$work" && cd "$work"
run() {
  f=$1; arch=$2; extra=$3
  n=$(basename $f .cu)
  echo "#include \"$tree/$f\"" > wrap_${n}_$tag.cpp
  s=$(date +%s.%N)
  "$nvcc" -forward-unknown-to-host-compiler -DFLASHLAB_EMULATOR=1 -DFLASHLAB_HAVE_CUDA=1 -I$tree -isystem=/usr/local/cuda/include -O3 -DNDEBUG -Xcompiler=-fPIC $arch $extra -std=c++20 --compress-mode=none -x cu -c $tree/$f -o nvcc_${n}_$tag.o || echo FAIL
  e=$(date +%s.%N)
  /usr/bin/c++ -DFLASHLAB_EMULATED=1 -DFLASHLAB_EMULATOR=1 -DFLASHLAB_HAVE_CUDA=1 -I$tree/emulator/include -I$tree -isystem /usr/local/cuda/include -O3 -DNDEBUG -fPIC -fno-semantic-interposition -march=native -fno-strict-aliasing -fno-tree-sra -ffp-contract=off -Wno-unknown-pragmas -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -fopenmp -std=c++20 -c wrap_${n}_$tag.cpp -o emu_${n}_$tag.o || echo FAIL
  g=$(date +%s.%N)
  printf "%-6s %-14s nvcc %6.1f s, fatbin %9d bytes | emulator %5.1f s, object %8d bytes\n" $tag $n $(echo "$e - $s" | bc) $(size -A nvcc_${n}_$tag.o | awk '/nv_fatbin/{print $2}') $(echo "$g - $e" | bc) $(stat -c %s emu_${n}_$tag.o)
}
both="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a"
run cuda_v2/split_q.cu "$both" -lineinfo
run cuda_v2/backward.cu "$both" -lineinfo
run cuda_v2/split_q_simt.cu "$both" -lineinfo
run decoding/cuda_split_kv.cu "$both" --expt-relaxed-constexpr
run cuda_v3_hopper/ws_launch.cu "-gencode=arch=compute_90a,code=sm_90a" ""
