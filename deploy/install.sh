#!/bin/sh
# Install gpuaas's systemd units, their environment files and the docs they point at, and put the console
# script where every unit's ExecStart points (/usr/local/bin/gpuaas). Idempotent; an existing
# /etc/gpuaas/*.env is kept.
#
#   python3 -m venv /opt/gpuaas && /opt/gpuaas/bin/pip install gpuaas_reconciler-*.whl  # a GPU host: "WHEEL[host]"
#   sh deploy/install.sh                          # links /usr/local/bin/gpuaas -> /opt/gpuaas/bin/gpuaas
#   sh deploy/install.sh --gpuaas "$(command -v gpuaas)"
#   sh deploy/install.sh --root /tmp/image        # into an image tree (no user, no daemon-reload)
#
# Run from a checkout or an unpacked source archive (it reads deploy/systemd, README.md and docs/ beside it).
set -eu

root=""
gpuaas=/opt/gpuaas/bin/gpuaas
while [ $# -gt 0 ]; do
    case "$1" in
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        --gpuaas) gpuaas="${2:?--gpuaas needs the path of an installed gpuaas}"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
case "$gpuaas" in
    /*) ;;
    *) echo "install.sh: --gpuaas must be an absolute path, not $gpuaas" >&2; exit 2 ;;
esac

src="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$root$gpuaas" ]; then
    echo "install.sh: $root$gpuaas is not an executable gpuaas; install the package first" \
         "(python3 -m venv /opt/gpuaas && /opt/gpuaas/bin/pip install gpuaas_reconciler-*.whl) or pass --gpuaas" >&2
    exit 1
fi

# The console script where ExecStart points: systemd-analyze verify (and systemd) need it there.
install -d -m 0755 "$root/usr/local/bin"
ln -sfn "$gpuaas" "$root/usr/local/bin/gpuaas"

# The units and their environment files (examples only where none is configured yet).
install -d -m 0755 "$root/etc/systemd/system"
install -m 0644 "$src"/deploy/systemd/gpuaas-*.service "$root/etc/systemd/system/"
install -d -m 0750 "$root/etc/gpuaas"
for pair in gpuaas.env.example:gpuaas.env host.env.example:host.env; do
    from="${pair%%:*}" to="${pair#*:}"
    [ -e "$root/etc/gpuaas/$to" ] || install -m 0640 "$src/deploy/systemd/$from" "$root/etc/gpuaas/$to"
done

# The docs the units' Documentation= lines name.
install -d -m 0755 "$root/usr/share/doc/gpuaas/docs"
install -m 0644 "$src/README.md" "$root/usr/share/doc/gpuaas/README.md"
install -m 0644 "$src"/docs/*.md "$root/usr/share/doc/gpuaas/docs/"
# Shipped monitoring: Prometheus alerting rules (rule_files) and the Grafana dashboard to import.
install -d -m 0755 "$root/usr/share/doc/gpuaas/prometheus" "$root/usr/share/doc/gpuaas/grafana"
install -m 0644 "$src/deploy/prometheus/gpuaas-alerts.yml" "$root/usr/share/doc/gpuaas/prometheus/"
install -m 0644 "$src/deploy/grafana/gpuaas.json" "$root/usr/share/doc/gpuaas/grafana/"

if [ -z "$root" ]; then
    id gpuaas >/dev/null 2>&1 || useradd --system --home /var/lib/gpuaas --shell /usr/sbin/nologin gpuaas
    install -d -m 0750 -o gpuaas -g gpuaas /var/lib/gpuaas
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
    fi
fi
echo "installed: $root/usr/local/bin/gpuaas -> $gpuaas, units in $root/etc/systemd/system," \
     "docs in $root/usr/share/doc/gpuaas"
