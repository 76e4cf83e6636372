#!/usr/bin/env bash
# cgroup_run.sh [--info FILE] LIMIT_BYTES CMD...
#
# Runs CMD in a fresh child cgroup whose memory limit is LIMIT_BYTES (and no swap), removes
# the cgroup afterwards, and exits with CMD's status: 137 when the kernel OOM-killed it.
# Exits 77 when the machine does not let this process make such a cgroup (no memory
# controller, not allowed to create children or enable the controller); tests skip then.
# SIGTERM and SIGINT are passed on to CMD.
#
# cgroup v2 is used where its memory controller is available (a child of the process's own
# cgroup when that one may delegate, else a sibling), otherwise cgroup v1's memory
# controller (hybrid machines). The two differ when a limit is lowered below the usage:
# v2 reclaims and OOM-kills, v1 refuses the write (EBUSY).
#
# --info FILE receives, before CMD starts, shell-style lines
#   version=2|1  dir=CGROUP_DIR  limit_file=CGROUP_DIR/memory.max|memory.limit_in_bytes
# (a test lowers the limit by writing limit_file while CMD runs), and once CMD ended
#   oom_kill=N   (processes the kernel OOM-killed in the cgroup).
set -u

info=
if [ "${1:-}" = --info ]; then info=$2; shift 2; fi
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: cgroup_run.sh [--info FILE] LIMIT_BYTES CMD..." >&2
  exit 2
fi
limit=$1
shift
name="slim-cgroup-run-$$"

skip() {
  echo "cgroup_run: $1; cgroups not available here" >&2
  exit 77
}

# The mount point of the hierarchy whose mountinfo fstype is $1 and (v1) whose super
# options name $2; the mount's own root must be "/" (a container without a cgroup
# namespace sees a part of the hierarchy it cannot place itself in).
mount_of() {
  awk -v type="$1" -v opt="$2" '{
    for (i = 7; i <= NF && $i != "-"; i++) {}
    if ($(i + 1) == type && $4 == "/" && (opt == "" || ("," $(i + 3) ",") ~ ("," opt ","))) {
      print $5; exit
    }
  }' /proc/self/mountinfo
}

cg= version= limit_file=
v2_mount=$(mount_of cgroup2 "")
v2_path=$(sed -n 's/^0:://p' /proc/self/cgroup)
if [ -n "$v2_mount" ] && [ -n "$v2_path" ]; then
  own="$v2_mount${v2_path%/}"
  # A child gets memory.* files when its parent delegates the memory controller, which a
  # cgroup holding processes may not (except the root): a child of our own cgroup where it
  # delegates or may start to, else a sibling where our parent delegates already.
  for parent in "$own" "$(dirname "$own")"; do
    case "$parent" in "$v2_mount"*) ;; *) continue ;; esac
    grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null ||
      { [ "$parent" = "$own" ] && echo +memory 2>/dev/null >"$parent/cgroup.subtree_control"; } || continue
    mkdir "$parent/$name" 2>/dev/null || continue
    if [ -e "$parent/$name/memory.max" ]; then
      cg="$parent/$name" version=2 limit_file="$cg/memory.max"
      break
    fi
    rmdir "$parent/$name"
  done
fi
if [ -z "$cg" ]; then
  v1_mount=$(mount_of cgroup memory)
  v1_path=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}://p' /proc/self/cgroup)
  [ -n "$v1_mount" ] && [ -n "$v1_path" ] || skip "no cgroup v2 memory controller and no cgroup v1 memory hierarchy"
  mkdir "$v1_mount${v1_path%/}/$name" 2>/dev/null || skip "cannot create a cgroup under $v1_mount${v1_path%/}"
  cg="$v1_mount${v1_path%/}/$name" version=1 limit_file="$cg/memory.limit_in_bytes"
fi

cleanup() {
  # Whatever CMD left behind in the cgroup goes with it.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    rmdir "$cg" 2>/dev/null && return
    if [ -e "$cg/cgroup.kill" ]; then echo 1 >"$cg/cgroup.kill"; else xargs -r kill -9 <"$cg/cgroup.procs"; fi 2>/dev/null
    sleep 0.1
  done
  echo "cgroup_run: could not remove $cg" >&2
}

if ! echo "$limit" >"$limit_file" 2>/dev/null; then
  cleanup
  skip "cannot set $limit_file"
fi
# No swap, so exceeding the limit OOM-kills instead of swapping (v1: memsw = memory + swap,
# set after the memory limit, which it may not undercut).
if [ $version = 2 ]; then
  [ ! -e "$cg/memory.swap.max" ] || echo 0 >"$cg/memory.swap.max"
else
  [ ! -e "$cg/memory.memsw.limit_in_bytes" ] || echo "$limit" >"$cg/memory.memsw.limit_in_bytes"
fi
[ -z "$info" ] || printf 'version=%s\ndir=%s\nlimit_file=%s\n' $version "$cg" "$limit_file" >"$info"

(echo "$BASHPID" >"$cg/cgroup.procs" && exec "$@") &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM
trap 'kill -INT $child 2>/dev/null' INT
# A trapped signal ends `wait` early; wait again until CMD is gone for its real status.
wait $child
rc=$?
while kill -0 $child 2>/dev/null; do
  wait $child
  rc=$?
done

if [ $version = 2 ]; then events="$cg/memory.events"; else events="$cg/memory.oom_control"; fi
oom_kill=$(awk '$1 == "oom_kill" { print $2 }' "$events")
[ -z "$info" ] || echo "oom_kill=${oom_kill:-0}" >>"$info"
[ "${oom_kill:-0}" = 0 ] || echo "cgroup_run: the kernel OOM-killed ${oom_kill} process(es) in $cg (limit $(cat "$limit_file") bytes)" >&2
cleanup
exit $rc
