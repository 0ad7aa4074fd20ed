#!/usr/bin/env bash
# manifests_check.sh SRC GIFTD: the deployment files, offline.
#   - docker/docker-compose.yml against the Compose Specification schema,
#     docker/k8s/*.yaml against the Kubernetes schemas (tests/ops/schemas,
#     strict), the ConfigMap's giftd.conf equal to docker/giftd.conf, the
#     Dockerfile's stages and COPY sources (validate_manifests.py);
#   - a broken copy of each is rejected by the same check, naming the fault;
#   - docker/giftd.conf passes `giftd --check-config`;
#   - the Slurm scripts pass `bash -n` (and shellcheck, where installed).
# Exit 77 (skipped) when PyYAML or jsonschema is missing.
set -euo pipefail
src=${1:?usage: manifests_check.sh SRC GIFTD}
giftd=${2:?}
py=/usr/bin/python3
[[ -x $py ]] || py=python3
val=("$py" "$src/tests/ops/validate_manifests.py")
work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-manifests-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "manifests_check: FAIL: $*" >&2; exit 1; }

compose=$src/docker/docker-compose.yml
sts=$src/docker/k8s/giftd.yaml
job=$src/docker/k8s/worker-job.yaml
conf=$src/docker/giftd.conf

set +e
"${val[@]}" --compose "$compose" --k8s "$sts" --k8s "$job" --conf "$conf" \
    --dockerfile "$src/docker/Dockerfile" --context "$src"
rc=$?
set -e
[[ $rc -eq 77 ]] && exit 77
[[ $rc -eq 0 ]] || fail "the deployment files do not validate"

# expect_reject NAME PATTERN ARGS...: the check must fail and print PATTERN.
expect_reject() {
    local name=$1 pattern=$2
    shift 2
    if "${val[@]}" "$@" >"$work/out" 2>&1; then
        cat "$work/out" >&2
        fail "broken $name accepted"
    fi
    grep -q -- "$pattern" "$work/out" || { cat "$work/out" >&2; fail "broken $name: no '$pattern' in the errors"; }
    echo "manifests_check: broken $name rejected: $(grep -m1 -- "$pattern" "$work/out")"
}

sed 's/condition: service_healthy/condition: service_ready/' "$compose" >"$work/compose-1.yml"
expect_reject "compose (bad depends_on condition)" "depends_on" --compose "$work/compose-1.yml"
sed 's/stop_grace_period:/stop_grace_periods:/' "$compose" >"$work/compose-2.yml"
expect_reject "compose (misspelt key)" "stop_grace_periods" --compose "$work/compose-2.yml"
sed 's/^  serviceName: giftd/  servicename: giftd/' "$sts" >"$work/sts.yaml"
expect_reject "StatefulSet (misspelt field)" "servicename" --k8s "$work/sts.yaml"
sed 's/containerPort: 7070/containerPort: "7070x"/' "$sts" >"$work/sts-2.yaml"
expect_reject "StatefulSet (port not a number)" "is not of type 'integer'" --k8s "$work/sts-2.yaml"
sed 's/readOnly: true/readonly: true/' "$job" >"$work/job.yaml"
expect_reject "Job (misspelt field)" "readonly" --k8s "$work/job.yaml"
sed 's/^num_shards = 2/num_shards = 3/' "$conf" >"$work/giftd.conf"
expect_reject "ConfigMap (differs from docker/giftd.conf)" "differs" --k8s "$sts" --conf "$work/giftd.conf"
sed 's/^USER giftd/USER root/' "$src/docker/Dockerfile" >"$work/Dockerfile"
expect_reject "Dockerfile (root user)" "runs as root" --compose "$compose" --dockerfile "$work/Dockerfile" --context "$src"

# The configuration the containers share is one giftd accepts (the key file
# is the secret's business, the data folder the volume's).
GIFTD_AUTH_KEY_FILE='' GIFTD_DATA_DIR="$work/data" "$giftd" --config "$conf" --check-config \
    >"$work/check.out" 2>&1 || { cat "$work/check.out" >&2; fail "giftd --check-config $conf"; }
echo "manifests_check: giftd --check-config accepts docker/giftd.conf"

slurm=("$src"/examples/slurm/*.sbatch)
for f in "${slurm[@]}"; do
    bash -n "$f" || fail "bash -n $f"
done
if command -v shellcheck >/dev/null 2>&1; then
    shellcheck -s bash "${slurm[@]}" || fail "shellcheck examples/slurm"
fi
echo "manifests_check: ok"
