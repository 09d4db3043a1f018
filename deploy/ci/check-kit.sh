#!/usr/bin/env bash
# The operator's kit, checked end to end (CI runs this once; it needs root, as CI has):
#   1. installs what the kit's checks need from Debian (chromium, buildah, debootstrap; kubectl and
#      promtool are expected from the prometheus/kubernetes-client packages the suite already uses)
#   2. runs the kit's tests with POOL_ADVISOR_REQUIRE_BINARIES=1 (no skip): kustomize + schema, the
#      Containerfile/systemd lint, the landing page screenshot in headless Chromium, the exporter
#   3. makes a Debian base with debootstrap (no registry is reachable), builds deploy/Containerfile
#      with buildah on it, and runs the image once (--read-only, as uid 10001): `pool-advisor --help`
#      and `run --once` against nothing must answer, not crash
# Skip step 2 with KIT_SKIP_TESTS=1, step 3 with KIT_SKIP_IMAGE=1. The base rootfs is cached in $KIT_CACHE (default /var/cache/pool-advisor-kit).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO="$(pwd)"
CACHE="${KIT_CACHE:-/var/cache/pool-advisor-kit}"
BASE_IMAGE="localhost/debian-bookworm-python:latest"
IMAGE="localhost/sglang-pool-advisor:ci"
started=$(date +%s)

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-dejavu-core)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "kit: tools ready after $(( $(date +%s) - started ))s"

# KIT_SKIP_TESTS=1: the caller runs the whole suite afterwards (.ci/run does, once the package is installed)
if [ "${KIT_SKIP_TESTS:-0}" != "1" ]; then
    POOL_ADVISOR_REQUIRE_BINARIES=1 python3 -m pytest -q \
        tests/export/test_deploy_kit.py tests/export/test_landing_page_charts.py \
        tests/export/test_exporter_hardening.py tests/export/test_alert_rules.py
    echo "kit: tests done after $(( $(date +%s) - started ))s"
fi

if [ "${KIT_SKIP_IMAGE:-0}" = "1" ]; then
    echo "kit: image build skipped (KIT_SKIP_IMAGE=1)"
    exit 0
fi

# 3a. the base: debootstrap once, cached; imported as an image without any registry
if ! buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    if [ ! -x "$CACHE/rootfs/usr/bin/python3" ]; then
        mkdir -p "$CACHE"
        rm -rf "$CACHE/rootfs"
        # the same Debian mirror and release this machine's apt uses (no other source is reachable)
        suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
        mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
                 | grep -v security | head -1)
        [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
        [ -n "$mirror" ] || { echo "kit: no Debian mirror found in apt's sources"; exit 1; }
        debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$CACHE/rootfs" \
            "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log"; exit 1; }
        rm -rf "$CACHE/rootfs/var/cache/apt/archives/"*.deb "$CACHE/rootfs/var/lib/apt/lists/"*
    fi
    ctr=$(buildah from scratch)
    mnt=$(buildah mount "$ctr")
    tar -C "$CACHE/rootfs" -cf - . | tar -C "$mnt" -xf -
    buildah umount "$ctr" >/dev/null
    buildah commit -q "$ctr" "$BASE_IMAGE" >/dev/null
    buildah rm "$ctr" >/dev/null
fi
echo "kit: base image ready after $(( $(date +%s) - started ))s"

# 3b. the build context: the tracked files plus the wheels (built here, so the image build is offline)
CONTEXT="$(mktemp -d)"
trap 'rm -rf "$CONTEXT"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$CONTEXT"
python3 -m pip wheel -q --no-cache-dir "$CONTEXT" -w "$CONTEXT/dist/wheels" >"$CONTEXT/wheel.log" 2>&1 \
    || { tail -20 "$CONTEXT/wheel.log"; exit 1; }
buildah build -q --isolation chroot --layers=false --build-arg BASE="$BASE_IMAGE" \
    -f "$CONTEXT/deploy/Containerfile" -t "$IMAGE" "$CONTEXT" >/dev/null
echo "kit: image built after $(( $(date +%s) - started ))s"

# 3c. run it once as the image's user on a read-only root (only the state dir and /tmp writable, as
# deploy/kubernetes mounts them): the CLI answers, the config as shipped loads, the checkpoint is written.
# buildah run has no --read-only, so the image's rootfs is bind-mounted read-only in a private mount
# namespace and entered with chroot.
ctr=$(buildah from "$IMAGE")
trap 'rm -rf "$CONTEXT"; buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$IMAGE")
[ "$user" = "10001:10001" ] || { echo "kit: image user is '$user', want 10001:10001"; exit 1; }
mnt=$(buildah mount "$ctr")
set +e
out=$(unshare --mount sh -ec '
    root="$1"
    mount --bind "$root" "$root" && mount -o remount,bind,ro "$root"
    mount -t tmpfs -o uid=10001,gid=10001 tmpfs "$root/var/lib/pool-advisor"
    mount -t tmpfs tmpfs "$root/tmp"
    chroot --userspec=10001:10001 "$root" /opt/pool-advisor/bin/pool-advisor --help >/dev/null
    if touch "$root/etc/probe" 2>/dev/null; then echo "root filesystem is writable"; exit 3; fi
    chroot --userspec=10001:10001 "$root" env -i SGLANG_API_KEY=unused \
        POOL_ADVISOR_CHECKPOINT_PATH=/var/lib/pool-advisor/checkpoint.json \
        /opt/pool-advisor/bin/pool-advisor run --config /etc/pool-advisor/advisor.yaml --once 2>&1
    rc=$?
    test -s "$root/var/lib/pool-advisor/checkpoint.json" || { echo "no checkpoint written"; exit 4; }
    exit $rc
' sh "$mnt" 2>&1)
rc=$?
set -e
# no SGLang in the build sandbox: exit 1 (target down) with a one-line reason is the expected answer
if [ "$rc" != "1" ] || echo "$out" | grep -q Traceback; then
    echo "kit: run --once in the image exited $rc:"; echo "$out"; exit 1
fi
echo "kit: image ran once on a read-only root as 10001 (run --once: target down, exit 1, checkpoint written)"
echo "kit: done in $(( $(date +%s) - started ))s"
