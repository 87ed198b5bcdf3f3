#!/usr/bin/env bash
# Install what stasis needs on a Debian/Ubuntu host, idempotently and quickly when already done.
#   scripts/setup.sh        what `make demo` needs: system packages (runsc, mmdebstrap, QEMU and a guest kernel,
#                           ...), stasis in .venv, the default image, the microVM boot files (`stasis doctor`)
#   scripts/setup.sh test   that, and what `make test` needs besides: the test dependencies, Harbor's own venv,
#                           E2B's npm package, and the code-interpreter and desktop images, built in the
#                           background while the rest installs (anything else builds a built-in image on first use)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-demo}
case "$mode" in demo|test) ;; *) echo "usage: scripts/setup.sh [demo|test]" >&2; exit 2 ;; esac

started=$SECONDS
say() { printf '\033[1m==> %s\033[0m  (%ds)\n' "$*" "$((SECONDS - started))"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

# Each tool stasis calls, and the Debian package that brings it. Only what is missing is installed:
# a host whose node comes from elsewhere (NodeSource's bundles npm) cannot take Debian's npm package.
declare -A package_of=(
  [runsc]=runsc [mmdebstrap]=mmdebstrap [tmux]=tmux [mkfs.ext4]=e2fsprogs [newuidmap]=uidmap
  [ssh]=openssh-client [rsync]=rsync [nft]=nftables [ip]=iproute2 [nsenter]=util-linux
  [skopeo]=skopeo [umoci]=umoci
  # volumes: a btrfs file system in a file (instant snapshots and forks, size limits)
  [mkfs.btrfs]=btrfs-progs
  # the microVM backend: QEMU, and busybox for the initramfs of Debian's cloud kernel (virtio as modules)
  [qemu-system-x86_64]=qemu-system-x86 [qemu-img]=qemu-utils [busybox]=busybox-static
  # the web console: npm fetches its pinned front-end files; the browser tests drive Debian's chromium
  [npm]=npm [chromium]=chromium
)
need_apt=()
for tool in "${!package_of[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("${package_of[$tool]}")
done
dpkg -s ca-certificates >/dev/null 2>&1 || need_apt+=(ca-certificates)
ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || need_apt+=(linux-image-cloud-amd64)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
# E2B's get_host names PORT-ID.localhost:PORT; glibc resolves *.localhost to loopback only with nss-myhostname
# (Debian's package adds it to nsswitch.conf's hosts line)
getent hosts stasis-probe.localhost >/dev/null 2>&1 || need_apt+=(libnss-myhostname)

if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing system packages: ${need_apt[*]}"
  # runsc from bookworm-backports has --platform=systrap and faster checkpoints; add that suite,
  # reusing the mirror this host already uses.
  if grep -qs 'bookworm' /etc/os-release && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    mirror=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | grep -v security | head -n1 | awk '{print $2}')
    [ -n "$mirror" ] || mirror=$(grep -hs '^deb ' /etc/apt/sources.list | grep -v security | head -n1 | awk '{print $2}')
    if [ -n "$mirror" ]; then
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$mirror" | $SUDO tee /etc/apt/sources.list.d/stasis-backports.sources >/dev/null
    fi
  fi
  $SUDO apt-get update -qq
  rest=()
  for package in "${need_apt[@]}"; do
    if [ "$package" = runsc ]; then
      $SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports runsc >/dev/null 2>&1 \
        || $SUDO apt-get install -y -qq --no-install-recommends runsc >/dev/null
    else
      rest+=("$package")
    fi
  done
  [ ${#rest[@]} -eq 0 ] || $SUDO apt-get install -y -qq --no-install-recommends "${rest[@]}" >/dev/null
fi
say "runsc: $(runsc --version | head -n1)"

# Python packages go in with uv (seconds, from this machine's uv cache; pip took minutes), which pip brings into
# .venv first. uv's own lines are the progress, less one line per package. Returns the installer's status.
quietly() {
  set +e
  "$@" 2>&1 | grep --line-buffered -v -E '^WARNING: Location|^ [-+~] ' | cut -c1-120
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}
uv_install() {  # uv_install VENV PIP-INSTALL-ARGS...
  local venv=$1
  shift
  quietly .venv/bin/uv pip install --python "$venv/bin/python" "$@"
}
# The requirements of pyproject.toml's extras "$@" (a `stasis[x]` among them unfolded): installed as such, so
# stasis itself is not reinstalled under the image builds that run from it meanwhile.
extras() {
  .venv/bin/python - "$@" <<'PY'
import re, sys, tomllib
optional = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
def unfold(extra):
    for requirement in optional[extra]:
        nested = re.fullmatch(r"stasis\[(.+)\]", requirement)
        yield from (r for name in nested.group(1).split(",") for r in unfold(name.strip())) if nested else [requirement]
print("\n".join(dict.fromkeys(r for extra in sys.argv[1:] for r in unfold(extra))))
PY
}

core=.venv/.stasis-core
if [ ! -x .venv/bin/python ] || [ pyproject.toml -nt "$core" ] || [ ! -f "$core" ]; then
  say "creating .venv with stasis"
  python3 -m venv .venv
  quietly .venv/bin/pip install -q uv || { echo "setup: installing uv into .venv failed (above)" >&2; exit 1; }
  uv_install .venv -e . || { echo "setup: installing stasis into .venv failed (above)" >&2; exit 1; }
  touch "$core"
fi

# The console's terminal: xterm.js and its fit addon, pinned, from the npm registry into the package.
vendor=src/stasis/daemon/faces/console/static/vendor
if [ ! -f "$vendor/.xterm-6.0.0" ]; then
  say "fetching the console's front-end files (xterm.js) with npm"
  scratch=$(mktemp -d)
  (cd "$scratch" && npm pack --silent @xterm/xterm@6.0.0 @xterm/addon-fit@0.11.0 >/dev/null)
  mkdir -p "$vendor"
  tar -xzf "$scratch/xterm-xterm-6.0.0.tgz" -C "$scratch"
  cp "$scratch/package/lib/xterm.js" "$scratch/package/css/xterm.css" "$vendor/"
  cp "$scratch/package/LICENSE" "$vendor/LICENSE.xterm"
  rm -rf "$scratch/package"
  tar -xzf "$scratch/xterm-addon-fit-0.11.0.tgz" -C "$scratch"
  cp "$scratch/package/lib/addon-fit.js" "$vendor/"
  rm -rf "$scratch"
  touch "$vendor/.xterm-6.0.0"
fi

# The desktop's live view: noVNC's library (ES modules: core/ and the pako it vendors), pinned, from npm.
if [ ! -f "$vendor/.novnc-1.7.0" ]; then
  say "fetching the console's live view (noVNC) with npm"
  scratch=$(mktemp -d)
  (cd "$scratch" && npm pack --silent @novnc/novnc@1.7.0 >/dev/null)
  tar -xzf "$scratch/novnc-novnc-1.7.0.tgz" -C "$scratch"
  rm -rf "$vendor/novnc" && mkdir -p "$vendor/novnc"
  cp -r "$scratch/package/core" "$scratch/package/vendor" "$scratch/package/LICENSE.txt" "$vendor/novnc/"
  rm -rf "$scratch"
  touch "$vendor/.novnc-1.7.0"
fi

say "default image"
.venv/bin/python -m stasis.images default  # in place: no daemon runs yet (later, `stasis image build` asks it)

if [ "$mode" = demo ]; then
  say "backends on this host"
  .venv/bin/stasis doctor
  say "ready: make demo runs the demo; .venv/bin/stasis is the CLI"
  exit 0
fi

# The tests' other images build in the background beside the installs below (a build mostly waits on downloads
# and dpkg), each into a log of its own that is shown if it fails.
logs=$(mktemp -d)
declare -A building=()
stop_builds() {  # a set-up that fails (or is interrupted) leaves no build running behind it
  for pid in "${building[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap stop_builds EXIT
for image in code-interpreter desktop; do
  setsid .venv/bin/python -m stasis.images "$image" >"$logs/$image.log" 2>&1 &  # a process group: mmdebstrap too
  building[$image]=$!
done
say "building the code-interpreter and desktop images in the background"

stamp=.venv/.stasis-installed
if [ pyproject.toml -nt "$stamp" ] || [ ! -f "$stamp" ]; then
  say "installing the test dependencies into .venv"
  extras dev integrations fleet > "$logs/requirements.txt"
  uv_install .venv -r "$logs/requirements.txt" \
    || { echo "setup: installing the test dependencies failed (above)" >&2; exit 1; }
  touch "$stamp"
fi

# Harbor needs Python >= 3.12 (this project runs on 3.11): its adapter's tests use a venv of its own
harbor_python=""
for candidate in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python "$HOME"/.pyenv/versions/3.12*/bin/python; do
  # (a pyenv shim is on PATH even where its version is not selected: run it to know)
  if "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
    harbor_python=$(command -v "$candidate"); break
  fi
done
harbor_stamp=.venv-harbor/.stasis-installed
if [ -n "$harbor_python" ] && { [ ! -x .venv-harbor/bin/harbor ] || [ pyproject.toml -nt "$harbor_stamp" ]; }; then
  say "creating .venv-harbor with $harbor_python for the Harbor adapter"
  "$harbor_python" -m venv .venv-harbor
  uv_install .venv-harbor -e '.[harbor]' || { echo "setup: installing Harbor failed (above)" >&2; exit 1; }
  touch "$harbor_stamp"
elif [ -z "$harbor_python" ]; then
  say "no Python >= 3.12 here: the Harbor adapter's tests will say they cannot run"
fi

# The E2B face's JavaScript tests: the official e2b npm package, pinned by its lock file.
if [ ! -d tests/e2b/js/node_modules/e2b ] || [ tests/e2b/js/package-lock.json -nt tests/e2b/js/node_modules/.package-lock.json ]; then
  say "installing the e2b npm package for the E2B face's tests"
  (cd tests/e2b/js && npm ci --no-audit --no-fund --silent)
fi

for image in "${!building[@]}"; do
  if ! wait "${building[$image]}"; then
    echo "setup: building the $image image failed; the end of its log:" >&2
    tail -n 30 "$logs/$image.log" >&2
    unset 'building[$image]'
    exit 1
  fi
  say "$image image: $(tail -n 1 "$logs/$image.log")"
  unset 'building[$image]'
done

say "backends on this host"
.venv/bin/stasis doctor
