#!/usr/bin/env bash
# The public workloads of `ferry lab`: real "release N -> release N+1" data, pinned, fetched
# from the package registries only (PyPI, crates.io) and cached, plus three generated from them
# deterministically (lab/generate.py). Layout: OUT/workloads/<name>/{old,new}, then
#   ferry lab --workloads OUT/workloads
#
# Usage: bash lab/workloads.sh [OUT]        (OUT defaults to ./lab-workloads; ~250 MB, 1-3 min)
# Needs: python3 with venv and pip, cargo, tar, unzip, curl (apt-get install python3-venv unzip curl).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "${1:-lab-workloads}")
DL=$OUT/downloads
W=$OUT/workloads
say() { printf '[workloads %(%H:%M:%S)T] %s\n' -1 "$*"; }
for t in python3 cargo tar unzip curl sha256sum; do
  command -v "$t" >/dev/null || { echo "workloads.sh needs $t" >&2; exit 1; }
done
mkdir -p "$DL/pypi" "$DL/cargo" "$W"

# A private Python with pip and the pinned python-docx (for the document workload).
VENV=$OUT/venv
if [ ! -x "$VENV/bin/python" ]; then
  say "python venv"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q python-docx==1.1.2 lxml==5.3.0 typing_extensions==4.12.2
fi
PIP="$VENV/bin/pip"

# ------------------------------------------------------------------ pinned downloads
sdist() { # NAME VERSION: a source release
  [ -f "$DL/pypi/$1-$2.tar.gz" ] || "$PIP" download -q --no-deps --no-binary :all: "$1==$2" -d "$DL/pypi"
}
wheel() { # NAME VERSION: the CPython 3.11 manylinux x86_64 wheel
  ls "$DL/pypi/$1-$2"-cp311-*.whl >/dev/null 2>&1 ||
    "$PIP" download -q --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
      --python-version 3.11 --implementation cp --abi cp311 "$1==$2" -d "$DL/pypi"
}
say "downloads (PyPI)"
sdist Django 5.1.1
sdist Django 5.1.2
wheel numpy 2.1.1
wheel numpy 2.1.2

# `cargo vendor` of one throwaway project per side, every dependency pinned with `=` so the
# lock file (and so the vendored tree) is fully determined.
vendor() { # SIDE NAME=VERSION...
  local side=$1 dir=$DL/cargo/$1; shift
  [ -d "$dir/vendor" ] && return 0
  rm -rf "$dir"; mkdir -p "$dir/src"
  echo 'fn main() {}' > "$dir/src/main.rs"
  {
    printf '[package]\nname = "lab-%s"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n' "$side"
    for dep in "$@"; do printf '%s = "=%s"\n' "${dep%%=*}" "${dep#*=}"; done
  } > "$dir/Cargo.toml"
  (cd "$dir" && cargo generate-lockfile -q && cargo vendor --locked -q vendor > /dev/null)
}
say "downloads (crates.io)"
SAME=(aho-corasick=1.1.3 memchr=2.7.4 itoa=1.0.11 ryu=1.0.18 proc-macro2=1.0.86 quote=1.0.37)
vendor old "${SAME[@]}" regex=1.10.6 regex-automata=0.4.7 regex-syntax=0.8.4 serde=1.0.209 \
  serde_derive=1.0.209 serde_json=1.0.127 syn=2.0.77 unicode-ident=1.0.12 libc=0.2.158
vendor new "${SAME[@]}" regex=1.11.0 regex-automata=0.4.8 regex-syntax=0.8.5 serde=1.0.210 \
  serde_derive=1.0.210 serde_json=1.0.128 syn=2.0.79 unicode-ident=1.0.13 libc=0.2.159

# ------------------------------------------------------------------ the workloads
pair() { rm -rf "${W:?}/$1"; mkdir -p "$W/$1/old" "$W/$1/new"; }
say "unpack"
pair django-tree
tar xzf "$DL/pypi/Django-5.1.1.tar.gz" --strip-components=1 -C "$W/django-tree/old"
tar xzf "$DL/pypi/Django-5.1.2.tar.gz" --strip-components=1 -C "$W/django-tree/new"
pair django-sdist
cp "$DL/pypi/Django-5.1.1.tar.gz" "$W/django-sdist/old/Django.tar.gz"
cp "$DL/pypi/Django-5.1.2.tar.gz" "$W/django-sdist/new/Django.tar.gz"
pair crates-vendor
cp -a "$DL/cargo/old/vendor/." "$W/crates-vendor/old/"
cp -a "$DL/cargo/new/vendor/." "$W/crates-vendor/new/"
pair numpy-whl-tree
unzip -q "$DL"/pypi/numpy-2.1.1-cp311-*.whl -d "$W/numpy-whl-tree/old"
unzip -q "$DL"/pypi/numpy-2.1.2-cp311-*.whl -d "$W/numpy-whl-tree/new"
pair numpy-whl-raw
cp "$DL"/pypi/numpy-2.1.1-cp311-*.whl "$W/numpy-whl-raw/old/numpy.whl"
cp "$DL"/pypi/numpy-2.1.2-cp311-*.whl "$W/numpy-whl-raw/new/numpy.whl"

# Five consecutive releases of one project, for `ferry lab --lookaside OUT/releases/tokio` (the
# lookaside paper's five kernel releases): the crates.io archives, checked against pinned hashes.
say "downloads (crates.io releases)"
mkdir -p "$DL/crates" "$OUT/releases/tokio"
while read -r v sum; do
  f=$DL/crates/tokio-$v.crate
  if [ ! -f "$f" ]; then
    curl -sSfL -o "$f.part" "https://static.crates.io/crates/tokio/tokio-$v.crate"
    mv "$f.part" "$f"
  fi
  echo "$sum  $f" | sha256sum -c --quiet -
  rm -rf "$OUT/releases/tokio/$v"; mkdir -p "$OUT/releases/tokio/$v"
  tar xzf "$f" --strip-components=1 -C "$OUT/releases/tokio/$v"
done <<'PINS'
1.38.0 ba4f4a02a7a80d6f274636f0aa95c7e383b912d41fe721a31f29e29698585a4a
1.39.0 9c3318c4fc7126c339a40fbc025927d0328ca32259f68bfe4321660644c1f626
1.40.0 e2b070231665d27ad9ec9b8df639893f46727666c6767db40317fbe920a5d998
1.41.0 145f3413504347a2be84393cc8a7d2fb4d863b375909ea59f2158261aa258bbb
1.42.0 5cec9b21b0450273377fc97bd4c33a8acffc8c996c987a7c5b319a0083707551
PINS

say "generate mbox-append, text-insert, docx-edit; set times"
for w in mbox-append text-insert docx-edit; do pair "$w"; done
"$VENV/bin/python" "$here/generate.py" "$W"
say "done: $(du -sb "$W" | cut -f1) bytes in $W"
