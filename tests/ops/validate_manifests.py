#!/usr/bin/python3
"""validate_manifests.py [--compose FILE]... [--k8s FILE]... [--conf FILE]
                        [--dockerfile FILE --context DIR]

Validates deployment files against their published JSON schemas, offline:
  --compose FILE  a docker-compose file against the Compose Specification
                  schema (schemas/compose-spec.json, JSON Schema 2019-09)
  --k8s FILE      every document of a Kubernetes YAML file against the schema
                  of its apiVersion/kind (schemas/k8s-subset.json: Kubernetes
                  v1.14 definitions, strict: unknown fields are errors); a
                  kind the subset lacks is an error too
  --conf FILE     every ConfigMap key named giftd.conf must equal this file
                  (the ConfigMaps of the --k8s files)
  --dockerfile F  no schema exists for a Dockerfile and no engine runs here,
                  so: every COPY source exists under --context, each stage a
                  compose file builds (build.target) exists, and those stages
                  run as a non-root USER; the giftd stage has a HEALTHCHECK
Prints one line per error and exits 1 when there is any, 0 otherwise; 77
(skipped) when PyYAML or jsonschema is missing.
"""
import argparse
import json
import os
import sys

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover
    print("validate_manifests: %s; skipping" % e, file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "schemas")


def report(path, errors, where=""):
    n = 0
    for e in sorted(errors, key=lambda e: list(e.absolute_path)):
        loc = "/".join(str(p) for p in e.absolute_path) or "(top)"
        print("%s%s: %s: %s" % (path, where, loc, e.message[:300]))
        n += 1
    return n


def check_compose(path):
    schema = json.load(open(os.path.join(SCHEMAS, "compose-spec.json")))
    doc = yaml.safe_load(open(path))
    v = jsonschema.Draft201909Validator(schema)
    n = report(path, v.iter_errors(doc))
    # What the schema cannot say: a depends_on: service_healthy target
    # must have a healthcheck.
    services = doc.get("services", {}) if isinstance(doc, dict) else {}
    for name, svc in services.items():
        dep = (svc or {}).get("depends_on", {})
        if isinstance(dep, dict):
            for target, cond in dep.items():
                if target not in services:
                    print("%s: services/%s/depends_on: no service %s" % (path, name, target))
                    n += 1
                elif (cond or {}).get("condition") == "service_healthy" and \
                        "healthcheck" not in (services[target] or {}):
                    print("%s: services/%s/depends_on: %s has no healthcheck" % (path, name, target))
                    n += 1
    return n


def check_k8s(path, conf_text):
    subset = json.load(open(os.path.join(SCHEMAS, "k8s-subset.json")))
    n = 0
    for i, doc in enumerate(yaml.safe_load_all(open(path))):
        if doc is None:
            continue
        where = "[%d %s]" % (i, doc.get("kind", "?") if isinstance(doc, dict) else "?")
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            print("%s%s: not a Kubernetes object (apiVersion and kind)" % (path, where))
            n += 1
            continue
        api = doc["apiVersion"]
        group, version = api.split("/", 1) if "/" in api else ("", api)
        key = "%s/%s/%s" % (group, version, doc["kind"])
        if key not in subset["kinds"]:
            print("%s%s: %s is not in the schema subset (%s)" %
                  (path, where, key, ", ".join(sorted(subset["kinds"]))))
            n += 1
            continue
        schema = {"$schema": subset["$schema"], "definitions": subset["definitions"],
                  "$ref": "#/definitions/" + subset["kinds"][key]}
        n += report(path, jsonschema.Draft4Validator(schema).iter_errors(doc), where)
        if conf_text is not None and doc["kind"] == "ConfigMap":
            got = (doc.get("data") or {}).get("giftd.conf")
            if got is not None and got != conf_text:
                print("%s%s: data/giftd.conf differs from %s" % (path, where, ARGS.conf))
                n += 1
    return n


def dockerfile_stages(path):
    """Returns {stage: {"user": last USER, "healthcheck": bool, "copies": [src]}}."""
    stages, cur = {}, None
    lines, buf = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#") and not buf:
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    for line in lines:
        words = line.split()
        if not words:
            continue
        op = words[0].upper()
        if op == "FROM":
            base = words[1]
            name = words[3] if len(words) >= 4 and words[2].upper() == "AS" else base
            parent = stages.get(base, {"user": "root", "healthcheck": False})
            cur = stages[name] = {"user": parent["user"], "healthcheck": parent["healthcheck"],
                                  "copies": []}
        elif op == "USER":
            cur["user"] = words[1]
        elif op == "HEALTHCHECK":
            cur["healthcheck"] = "NONE" not in words[1:2]
        elif op in ("COPY", "ADD") and not any(w.startswith("--from") for w in words[1:]):
            args = [w for w in words[1:] if not w.startswith("--")]
            cur["copies"].extend(args[:-1])
    return stages


def check_dockerfile(path, context, compose_files):
    stages = dockerfile_stages(path)
    n = 0
    for name, st in stages.items():
        for src in st["copies"]:
            if not os.path.exists(os.path.join(context, src)):
                print("%s: stage %s copies %s, which is not in %s" % (path, name, src, context))
                n += 1
    targets = set()
    for f in compose_files:
        doc = yaml.safe_load(open(f))
        for svc in (doc.get("services") or {}).values():
            b = (svc or {}).get("build")
            if isinstance(b, dict) and b.get("target"):
                targets.add(b["target"])
    for t in sorted(targets):
        if t not in stages:
            print("%s: the compose files build target %s, which is no stage" % (path, t))
            n += 1
        elif stages[t]["user"] in ("root", "0", "0:0"):
            print("%s: stage %s runs as root" % (path, t))
            n += 1
    if "giftd" in stages and not stages["giftd"]["healthcheck"]:
        print("%s: stage giftd has no HEALTHCHECK" % path)
        n += 1
    return n


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compose", action="append", default=[])
    p.add_argument("--k8s", action="append", default=[])
    p.add_argument("--conf")
    p.add_argument("--dockerfile")
    p.add_argument("--context", default=".")
    ARGS = p.parse_args()
    conf_text = open(ARGS.conf).read() if ARGS.conf else None
    n = 0
    for f in ARGS.compose:
        n += check_compose(f)
    for f in ARGS.k8s:
        n += check_k8s(f, conf_text)
    if ARGS.dockerfile:
        n += check_dockerfile(ARGS.dockerfile, ARGS.context, ARGS.compose)
    checked = len(ARGS.compose) + len(ARGS.k8s) + bool(ARGS.dockerfile)
    print("validate_manifests: %d file(s), %d error(s)" % (checked, n))
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
