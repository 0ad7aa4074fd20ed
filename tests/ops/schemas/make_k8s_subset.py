#!/usr/bin/python3
"""make_k8s_subset.py SWAGGER OUT: cuts the Kubernetes JSON schemas that
docker/k8s/ needs out of a full Kubernetes OpenAPI v2 document.

Kept: the definitions reachable from the kinds in KINDS, without their
"description" texts (the full document is 3 MB; this is about 1/20 of it).
Changed, as kubeconform/kubeval's "strict" schemas do: every object with
properties gets "additionalProperties": false, so a misspelt field is an
error rather than silently ignored; IntOrString and Quantity, which the
API accepts as a string or a number, become that oneOf. Nothing else is
edited. The source and version are recorded in the output's "source".

The committed k8s-subset.json was made from Debian bookworm's
golang-k8s-kube-openapi-dev 0.0~git20211014.b3fe75c-2 (Apache-2.0):
  /usr/share/gocode/src/k8s.io/kube-openapi/test/integration/testdata/aggregator/openapi.json
which is the OpenAPI document of Kubernetes v1.14.0:
  apt-get download golang-k8s-kube-openapi-dev && dpkg -x golang-k8s-kube-openapi-dev_*.deb x
  python3 make_k8s_subset.py x/usr/share/gocode/src/k8s.io/kube-openapi/test/integration/testdata/aggregator/openapi.json k8s-subset.json
"""
import json
import sys

KINDS = [
    ("", "v1", "ConfigMap"),
    ("", "v1", "Secret"),
    ("", "v1", "Service"),
    ("apps", "v1", "StatefulSet"),
    ("batch", "v1", "Job"),
]


def main():
    src, out = sys.argv[1], sys.argv[2]
    doc = json.load(open(src))
    defs = doc["definitions"]
    roots = {}
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            key = (gvk["group"], gvk["version"], gvk["kind"])
            if key in KINDS and not name.startswith("io.k8s.kubernetes."):
                roots[key] = name
    missing = [k for k in KINDS if k not in roots]
    if missing:
        sys.exit("kinds not found: %s" % missing)

    keep, todo = {}, list(roots.values())
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = defs[name]
        s = json.dumps(defs[name])
        i = 0
        while True:
            i = s.find('"#/definitions/', i)
            if i < 0:
                break
            j = s.find('"', i + 1)
            todo.append(s[i + 15:j])
            i = j

    def clean(node):
        if isinstance(node, dict):
            node = {k: clean(v) for k, v in node.items() if k != "description"}
            if isinstance(node.get("properties"), dict) and node.get("type", "object") == "object":
                node.setdefault("additionalProperties", False)
            return node
        if isinstance(node, list):
            return [clean(v) for v in node]
        return node

    out_defs = {n: clean(d) for n, d in sorted(keep.items())}
    out_defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {
        "oneOf": [{"type": "string"}, {"type": "integer"}]}
    out_defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {
        "oneOf": [{"type": "string"}, {"type": "number"}]}
    result = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "source": "Kubernetes %s OpenAPI (%s), definitions reachable from %s; "
                  "descriptions dropped, additionalProperties false on objects "
                  "(make_k8s_subset.py)" % (doc["info"]["version"], src.split("/src/")[-1],
                                            ", ".join(k[2] for k in KINDS)),
        "kinds": {"%s/%s/%s" % k: roots[k] for k in KINDS},
        "definitions": out_defs,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
