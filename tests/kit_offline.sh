#!/usr/bin/env bash
# Proof that the offline kit (./flashlab kit DIR, tools/kit.sh) is all the build needs beyond a CUDA machine's
# compilers: the system's own Eigen, doctest, Google Benchmark and Boost are taken out of sight, then the project
# is configured and built from scratch with the kit alone, `flashlab list` and the CPU harness run, and ldd
# shows that the programs load the kit's libraries.
#
#   bash tests/kit_offline.sh [--kit DIR] [--build-dir DIR] [--gencode FLAGS] [--cmake PATH]
#
# --kit: an existing kit (default: a fresh one in BUILD_DIR/kit); --build-dir: default build-offline/;
# --gencode: nvcc's -gencode flags (default: sm_90a only, as on a Hopper machine; the build then takes about
# half the nvcc time of the default sm_80 + sm_90a); --cmake: another CMake (the GPU machine's comes from PyPI,
# a 4.x, e.g. `python3 -m venv /tmp/cmake4 && /tmp/cmake4/bin/pip install "cmake>=4,<5"`).
#
# How the system's copies are hidden: in a private mount namespace (unshare -m, so nothing outside this script
# sees it), /usr is covered by an overlay whose upper layer holds a whiteout for every file that the system's
# packages of them installed (dpkg -L): for the build those files do not exist. Needs root (or a user namespace
# that may mount) and a Debian or Ubuntu system with dpkg. Not part of CI's run: it builds the whole project a
# second time (about 5 minutes on 2 cores).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="" build_dir="$root/build-offline" gencode="-gencode=arch=compute_90a,code=sm_90a" cmake=cmake
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kit) kit="$(cd "$2" && pwd)"; shift 2 ;;
    --build-dir) build_dir="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
    --gencode) gencode="$2"; shift 2 ;;
    --cmake) cmake="$(realpath "$2")"; shift 2 ;;
    *) echo "usage: bash tests/kit_offline.sh [--kit DIR] [--build-dir DIR] [--gencode FLAGS] [--cmake PATH]" >&2
       exit 2 ;;
  esac
done

if [[ "${FLASHLAB_KIT_NAMESPACE:-}" != 1 ]]; then
  # ---- outside: make the kit if needed, then run this script again inside a private mount namespace.
  mkdir -p "$build_dir"
  if [[ -z "$kit" ]]; then
    kit="$build_dir/kit"
    rm -rf "$kit"
    bash "$root/tools/kit.sh" "$kit"
  fi
  echo "== the kit: $(du -sh "$kit" | cut -f1) unpacked, $(tar -C "$kit" -czf - . | wc -c) bytes as a .tar.gz"
  # Every file of the system's packages of what the kit replaces (the unversioned -dev names too).
  hidden="$build_dir/hidden-files.txt"
  : >"$hidden"
  for package in libeigen3-dev doctest-dev libbenchmark-dev libbenchmark1debian libboost-dev libboost1.74-dev \
                 libboost-context-dev libboost-context1.74-dev libboost-context1.74.0; do
    dpkg -L "$package" 2>/dev/null | while IFS= read -r path; do
      [[ "$path" == /usr/* && ( -f "$path" || -L "$path" ) ]] && echo "$path"
    done >>"$hidden" || true
  done
  echo "== hiding $(wc -l <"$hidden") files of the system's packages (a private mount namespace)"
  env FLASHLAB_KIT_NAMESPACE=1 unshare --mount --propagation private \
    bash "${BASH_SOURCE[0]}" --kit "$kit" --build-dir "$build_dir" --gencode "$gencode" --cmake "$cmake"
  # Back outside, with the system's copies in sight again: the programs' run path still picks the kit's.
  echo "== with the system's copies in sight again (ldd)"
  for program in bin/flashlab bin/flashlab_bench tests/flashlab_tests; do
    ldd "$build_dir/build/$program" | grep -E 'libbenchmark|libboost' | sed 's/ (0x[0-9a-f]*)//' |
      while read -r line; do
        echo "  $program: $line"
        [[ "$line" == *"=> $kit/"* ]] || { echo "FAILED: not the kit's" >&2; exit 1; }
      done
  done
  echo "== the kit is enough: configured, built, listed and tested with the system's copies out of sight"
  exit 0
fi

# ---- inside the namespace: /usr with the packages' files whited out.
layer="$(mktemp -d)"
mount -t tmpfs flashlab-kit-proof "$layer"
mkdir -p "$layer/upper" "$layer/work"
while IFS= read -r path; do
  mkdir -p "$layer/upper/$(dirname "${path#/usr/}")"
  mknod "$layer/upper/${path#/usr/}" c 0 0  # an overlay whiteout: the path does not exist above
done <"$build_dir/hidden-files.txt"
mount -t overlay flashlab-kit-proof -o "lowerdir=/usr,upperdir=$layer/upper,workdir=$layer/work" /usr

echo "== the system's copies are out of sight"
for probe in /usr/include/eigen3/Eigen/Dense /usr/include/doctest/doctest.h /usr/include/benchmark/benchmark.h \
             /usr/include/boost/context/detail/fcontext.hpp /usr/share/eigen3/cmake/Eigen3Config.cmake \
             /usr/lib/cmake/doctest/doctestConfig.cmake /usr/lib/x86_64-linux-gnu/cmake/benchmark/benchmarkConfig.cmake \
             /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian /usr/lib/x86_64-linux-gnu/libboost_context.so; do
  if [[ -e "$probe" ]]; then
    echo "FAILED: $probe is still visible" >&2
    exit 1
  fi
  echo "  absent: $probe"
done

echo "== configure with only the kit (FLASHLAB_KIT=$kit)"
rm -rf "$build_dir/build"
# The configure command of bench/gpu_report.py (the release preset, another build folder).
"$cmake" --version | head -n 1 | sed 's/^/  /'
(cd "$root" && "$cmake" --preset release -B "$build_dir/build" -DFLASHLAB_KIT="$kit" \
  -DFLASHLAB_CUDA_GENCODE="$gencode" -DFLASHLAB_WERROR=ON) >"$build_dir/configure.log" 2>&1 ||
  { tail -n 30 "$build_dir/configure.log"; echo "FAILED: configure" >&2; exit 1; }
grep -E '^(Eigen3_DIR|doctest_DIR|benchmark_DIR|FLASHLAB_BOOST_CONTEXT_INCLUDE|FLASHLAB_BOOST_CONTEXT_LIBRARY)' \
  "$build_dir/build/CMakeCache.txt" | sed 's/^/  /'
if grep -E '^(Eigen3_DIR|doctest_DIR|benchmark_DIR|FLASHLAB_BOOST_CONTEXT_INCLUDE|FLASHLAB_BOOST_CONTEXT_LIBRARY)' \
     "$build_dir/build/CMakeCache.txt" | grep -v "=$kit/"; then
  echo "FAILED: a dependency above was found outside the kit" >&2
  exit 1
fi

echo "== build (every target; $(nproc) jobs)"
start=$(date +%s)
"$cmake" --build "$build_dir/build" --parallel "$(nproc)" >"$build_dir/build.log" 2>&1 ||
  { tail -n 30 "$build_dir/build.log"; echo "FAILED: build" >&2; exit 1; }
echo "  built in $(( $(date +%s) - start )) s"

echo "== flashlab list"
"$build_dir/build/bin/flashlab" list

echo "== the CPU harness"
"$(dirname "$(command -v "$cmake")")/ctest" --test-dir "$build_dir/build" -R '^harness$' --output-on-failure |
  grep -E 'tests passed|Total Test time'  # ctest fails the script (pipefail) when the harness fails

echo "== the libraries the programs load (ldd)"
status=0
for program in bin/flashlab bin/flashlab_bench tests/flashlab_tests; do
  echo "  $program:"
  count=0
  while read -r line; do
    count=$((count + 1))
    echo "    $line"
    [[ "$line" == *"=> $kit/"* ]] || status=1
  done < <(ldd "$build_dir/build/$program" | grep -E 'libbenchmark|libboost' | sed 's/ (0x[0-9a-f]*)//')
  [[ $count -gt 0 ]] || { echo "    (loads no kit library)"; status=1; }
done
if [[ $status -ne 0 ]]; then
  echo "FAILED: a kit library above does not resolve into the kit" >&2
  exit 1
fi
