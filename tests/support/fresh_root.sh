#!/usr/bin/env bash
# The README's two commands on a brand-new Debian 12 root: debootstrap (minbase) plus only
# git and make, entered with chroot, a fresh clone of this checkout's HEAD inside.
#
#   tests/support/fresh_root.sh run|test [CHECKOUT]
#
# run:  `make run` inside; then checks report.json and the compiled engine (tests/test_fresh_root.py)
# test: `make test` inside (about half an hour: by hand, before a release or a Makefile change)
# venv-test: only the test set-up inside (fills the download and wheel caches, e.g. the
#            llama-cpp-python build, so that a later `test` spends its time on the suite)
#
# Set up as a machine would be, where a chroot differs from one:
#  * its own mount namespace (unshare) whose root it really is (pivot_root): every mount
#    below vanishes with it, none can leak, nothing of the host is changed, and paths in
#    /proc/PID/maps read as on a machine; /proc, /sys (with tracefs and cgroups) and /dev are
#    the host's, bound in, as on the machine itself
#  * /run is a tmpfs (ip netns keeps its namespaces there)
#  * /etc/hosts names this host (debootstrap writes none; gloo and MPI resolve the host name)
#  * the network's TLS trust: where this host's pip is given a CA bundle (PIP_CERT, as on a
#    network whose proxy re-signs TLS), the root gets the same bundle for pip and git, as a
#    machine on that network would have it in its trust store; nothing else of the host's
#    pip or apt configuration goes in
# What is cached between runs (TAILGATE_FRESH_CACHE, default /var/cache/tailgate-fresh-root):
# the pristine root, never written after it is made (each run writes to an overlay on top),
# and the downloaded .deb and wheel files: the downloads, not the install steps.
set -euo pipefail

mode=${1:?usage: fresh_root.sh run|test|venv-test [CHECKOUT]}
src=${2:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
cache=${TAILGATE_FRESH_CACHE:-/var/cache/tailgate-fresh-root}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=$cache/bookworm-minbase-git-make
case $mode in run|test|venv-test) ;; *) echo "fresh_root.sh: mode is run, test or venv-test, not '$mode'" >&2; exit 2;; esac
[ "$(id -u)" = 0 ] || { echo "fresh_root.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh_root.sh: apt-get install debootstrap" >&2; exit 2; }

mkdir -p "$cache/apt-archives/partial" "$cache/pip"
exec 9>"$cache/lock"
flock 9  # one run makes the pristine root; the suite inside a root runs this script again
if [ ! -e "$base/.complete" ]; then
  echo "fresh_root: debootstrap --variant=minbase --include=git,make bookworm (once, cached)"
  rm -rf "$base.tmp"
  debootstrap --variant=minbase --include=git,make --cache-dir="$cache/apt-archives" \
    bookworm "$base.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  touch "$base.tmp/.complete"
  mv "$base.tmp" "$base"
fi
exec 9>&-

work=$(mktemp -d "${TMPDIR:-/var/tmp}/tailgate-fresh.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/upper" "$work/overlay-work" "$work/root" "$work/scratch"
export base work src mode cache PIP_CERT

# Everything from here runs in a private mount namespace (ns.sh), which ends in the root
# (inner.sh). Scripts of their own, so that neither is quoted inside the other.
cat > "$work/ns.sh" <<'NS'
set -euo pipefail
root=$work/root
mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/overlay-work" "$root"
mount --rbind /proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
mkdir -p "$root/var/cache/apt/archives" "$root/root/.cache/pip" "$root/var/tmp"
mount --bind "$cache/apt-archives" "$root/var/cache/apt/archives"
mount --bind "$cache/pip" "$root/root/.cache/pip"
# a fresh root of its own for the suite inside (tests/test_fresh_root.py runs there too):
# the same caches, and scratch space that is not on the overlay
mkdir -p "$root$cache" && mount --bind "$cache" "$root$cache"
mount --bind "$work/scratch" "$root/var/tmp"
printf "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost\n" "$(hostname)" \
  > "$root/etc/hosts"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
tls=()
if [ -n "${PIP_CERT:-}" ] && [ -r "$PIP_CERT" ]; then
  mkdir -p "$root/etc/fresh-root" && cp "$PIP_CERT" "$root/etc/fresh-root/ca.crt"
  tls=(PIP_CERT=/etc/fresh-root/ca.crt SSL_CERT_FILE=/etc/fresh-root/ca.crt)
fi
git clone --quiet "$src" "$root/root/tailgate"
cp "$work/inner.sh" "$root/root/fresh-inner.sh"
echo "fresh_root: make $mode in a fresh Debian 12 root ($root)"
# The root becomes this namespace's real root (pivot_root, then the host is detached), not a
# chroot inside the host's tree: a process in a mount namespace of its own (the tests make
# some) would otherwise show its files at their host paths in /proc/PID/maps.
cd "$root"
mkdir -p .host
pivot_root . .host
exec chroot . /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb MODE="$mode" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${tls[@]}" \
  bash /root/fresh-inner.sh
NS
cat > "$work/inner.sh" <<'INNER'
umount -l /.host && rmdir /.host
cd /root/tailgate
start=$(date +%s)
rc=0
make "$MODE" || rc=$?
echo "fresh_root: make $MODE exited $rc after $(( $(date +%s) - start )) s"
if [ "$MODE" = run ]; then
  if [ -s report.json ]; then cp report.json /var/tmp/report.json
  else echo "fresh_root: no report.json"; [ "$rc" = 0 ] && rc=1; fi
  if .venv/bin/python -c "import tailgate.bench.fastloop"; then
    echo "fresh_root: compiled engine present"
  else echo "fresh_root: the compiled engine is missing"; [ "$rc" = 0 ] && rc=1; fi
fi
exit $rc
INNER
rc=0
unshare --mount --propagation private -- bash "$work/ns.sh" || rc=$?
# what the root handed out through its /var/tmp (the scratch folder)
if [ "$mode" = run ] && [ -n "${FRESH_ROOT_OUT:-}" ] && [ -s "$work/scratch/report.json" ]; then
  mkdir -p "$FRESH_ROOT_OUT" && cp "$work/scratch/report.json" "$FRESH_ROOT_OUT/"
fi
exit $rc
