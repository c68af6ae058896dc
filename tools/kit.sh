#!/usr/bin/env bash
# ./flashlab kit DIR: what a bare, offline CUDA machine lacks for the build, gathered into DIR.
#
# A GPU machine with nvcc, CMake, ninja, g++ and python3 but no network has no Eigen, doctest, Google Benchmark
# or Boost.Context. This fetches Debian's packages of them as .deb files (apt-get download, on a machine that
# has a Debian or Ubuntu package index), unpacks them into DIR with dpkg -x and trims them to what the build
# uses: Eigen's headers and CMake files (not its unsupported modules), doctest, Google Benchmark's library and
# CMake files, and of Boost only the headers and library of Boost.Context. The build finds the kit through
# CMAKE_PREFIX_PATH=DIR/usr, or FLASHLAB_KIT=DIR (environment or CMake variable; see bench/README.md).
#
# The kit's libraries must load on the GPU machine's glibc: every one is checked to need glibc 2.36 or older.
set -euo pipefail

if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: ./flashlab kit DIR" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for tool in apt-get dpkg objdump tar; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "flashlab kit: needs $tool (run it on a Debian or Ubuntu machine with network)" >&2
    exit 2
  fi
done
# glibc of the oldest machine the kit is for; a library that needs a newer one is refused.
max_glibc=2.36

# The packages: headers and CMake files (-dev) and the run-time libraries they point at.
packages=(libeigen3-dev doctest-dev libbenchmark-dev libbenchmark1debian libboost-context1.74-dev
          libboost-context1.74.0 libboost1.74-dev)
# What is kept of each unpacked tree (paths under usr/; anything else is deleted). Boost.Context's header
# needs Boost.Config and two small headers; the rest of Boost (138 MB) is never included.
keep=(include/eigen3/Eigen include/eigen3/signature_of_eigen3_matrix_library share/eigen3/cmake
      include/doctest lib/cmake/doctest
      include/benchmark lib/x86_64-linux-gnu/cmake/benchmark
      lib/x86_64-linux-gnu/libbenchmark.so lib/x86_64-linux-gnu/libbenchmark.so.1debian
      lib/x86_64-linux-gnu/libbenchmark.so.1.7.1 lib/x86_64-linux-gnu/libbenchmark_main.a
      include/boost/config.hpp include/boost/config include/boost/context include/boost/cstdint.hpp
      include/boost/detail/workaround.hpp
      lib/x86_64-linux-gnu/libboost_context.so lib/x86_64-linux-gnu/libboost_context.so.1.74.0)

dir="$(mkdir -p "$1" && cd "$1" && pwd)"
if [[ -e "$dir/usr" ]]; then
  echo "flashlab kit: $dir already holds a kit (usr/): remove it first" >&2
  exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "flashlab kit: fetching ${packages[*]} ..." >&2
# apt-get download writes into the current folder; as root it warns that the _apt user cannot write there.
if ! (cd "$work" && apt-get download "${packages[@]}" >"$work/download.log" 2>&1); then
  cat "$work/download.log" >&2
  echo "flashlab kit: apt-get download failed (is there network and a package index? apt-get update)" >&2
  exit 1
fi
mkdir -p "$work/unpacked"
{
  echo "# flashlab kit: Debian packages unpacked with dpkg -x and trimmed (tools/kit.sh)"
  echo "# made $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
} >"$work/MANIFEST"
for deb in "$work"/*.deb; do
  dpkg -x "$deb" "$work/unpacked"
  echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$work/MANIFEST"
done

# Trim: move the kept paths into the kit.
mkdir -p "$dir/usr"
for path in "${keep[@]}"; do
  if [[ ! -e "$work/unpacked/usr/$path" && ! -L "$work/unpacked/usr/$path" ]]; then
    echo "flashlab kit: usr/$path is not in the packages: tools/kit.sh's list is out of date" >&2
    rm -rf "$dir/usr"
    exit 1
  fi
  mkdir -p "$dir/usr/$(dirname "$path")"
  cp -a "$work/unpacked/usr/$path" "$dir/usr/$path"
done

# CMake files that name their install prefix as an absolute /usr (Debian's doctest does) would point the build
# at the system's folders, which the offline machine lacks: make them find the prefix from where they lie.
while IFS= read -r file; do
  up=$(realpath --relative-to="$(dirname "$file")" "$dir/usr")
  sed -i "s|^set(_IMPORT_PREFIX \"/usr\")$|get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_DIR}/$up\" ABSOLUTE)|" "$file"
done < <(grep -rl '^set(_IMPORT_PREFIX "/usr")$' "$dir/usr" --include='*.cmake' || true)
if grep -rq '^set(_IMPORT_PREFIX "/usr")$' "$dir/usr" --include='*.cmake'; then
  echo "flashlab kit: a CMake file still names /usr as its prefix" >&2
  exit 1
fi

# The Boost headers the emulator really includes, asked of this compiler, must all be in the kit.
if command -v g++ >/dev/null 2>&1; then
  missing=$(g++ -std=c++20 -M -I"$root" -isystem "$dir/usr/include" "$root/emulator/fiber.cpp" 2>/dev/null |
            tr ' \\' '\n\n' | grep '/boost/' | grep -v "^$dir/" || true)
  if [[ -n "$missing" ]]; then
    echo "flashlab kit: emulator/fiber.cpp includes Boost headers the kit lacks:" >&2
    echo "$missing" >&2
    rm -rf "$dir/usr"
    exit 1
  fi
fi

# Every library's newest glibc symbol version.
status=0
libraries=()
while IFS= read -r library; do
  libraries+=("$library")
done < <(find "$dir/usr" -name '*.so*' -type f | sort)
{
  echo "# glibc and libstdc++ symbol versions each library needs (at most glibc $max_glibc):"
  for library in "${libraries[@]}"; do
    glibc=$(objdump -T "$library" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
    glibcxx=$(objdump -T "$library" | grep -o 'GLIBCXX_[0-9.]*' | sed 's/GLIBCXX_//' | sort -uV | tail -n 1)
    echo "${library#"$dir"/}: glibc ${glibc:-none}, libstdc++ ${glibcxx:-none}"
    if [[ -n "$glibc" && "$(printf '%s\n%s\n' "$glibc" "$max_glibc" | sort -V | tail -n 1)" != "$max_glibc" ]]; then
      echo "flashlab kit: ${library#"$dir"/} needs glibc $glibc, newer than $max_glibc" >&2
      status=1
    fi
  done
} >>"$work/MANIFEST"
cp "$work/MANIFEST" "$dir/MANIFEST"
[[ $status -eq 0 ]] || exit 1

files=$(find "$dir/usr" -type f -o -type l | wc -l)
unpacked=$(du -sh "$dir" | cut -f1)
tarball=$(tar -C "$dir" -czf - . | wc -c)
cat "$dir/MANIFEST"
echo
echo "kit contents (folders under usr/, size):"
(cd "$dir/usr" && du -sh include/* lib/cmake/* lib/x86_64-linux-gnu share/eigen3 | sed 's/^/  /')
echo
echo "flashlab kit: $dir: $files files, $unpacked unpacked, $((tarball / 1024)) KiB as a .tar.gz"
echo "build with it: FLASHLAB_KIT=$dir (or cmake -DCMAKE_PREFIX_PATH=$dir/usr); see bench/README.md"
