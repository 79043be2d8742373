# Source on a bare device machine from the repository root:  source bench/device_env.sh [WHEEL_DIR]
#
# Installs the wheels in WHEEL_DIR (default .whl: optuna and its dependencies for the device's Python, copied
# there from the shared wheel folder and carried with the checkout) into /tmp/kog-site, and makes `import kog`
# resolve to this checkout through a symlink tree in /tmp/kog-path (core/ as the package, probe/, tune/,
# engine/ and reports/ as its subpackages), then puts both on PYTHONPATH. An editable pip install left `kog`
# unimportable for the device's python3; the tree needs no install and follows edits to the checkout.
# KOG_GIT_COMMIT is not set here: the device copy's git metadata can be stale, so pass the commit in.
_kog_wheels=${1:-.whl}
if ls "$_kog_wheels"/*.whl >/dev/null 2>&1; then
    pip install -q --no-deps --target /tmp/kog-site "$_kog_wheels"/*.whl 2>&1 | grep -v WARNING | tail -2
fi
rm -rf /tmp/kog-path && mkdir -p /tmp/kog-path/kog
for _kog_f in "$PWD"/core/*; do ln -s "$_kog_f" /tmp/kog-path/kog/; done
for _kog_p in probe tune engine reports; do ln -sfn "$PWD/$_kog_p" "/tmp/kog-path/kog/$_kog_p"; done
export PYTHONPATH=/tmp/kog-path:/tmp/kog-site${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import kog.engine.monokernel, kog.tune.store" && echo "device_env: kog from $PWD"
unset _kog_wheels _kog_f _kog_p
