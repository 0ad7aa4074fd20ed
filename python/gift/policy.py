"""
gift.policy: the geometry owners' per-tensor decisions, read from the shards.

The shard holding chunk 0 of a tensor declared with geometry decides, at
every epoch, its treatment (giftd(8), POLICY): GIFT or Euclidean, the
transform rank, the push and pull codecs, and the chooser's predicted error
ratio and bits per element. Each shard shows the newest epoch's decision of
the tensors it owns in /metrics; `giftctl policy` prints the same table.

    import gift
    for row in gift.policy_table("127.0.0.1:7070,127.0.0.1:7072"):
        print(row["tensor"], row["mode"], row["rank"], row["push_codec"])

Standard library only; no worker connection is needed.
"""
import os
import re
import urllib.request

__all__ = ["policy_table", "shard_policies", "parse_metrics"]

_LINE = re.compile(r'^(giftd_[a-z_]+)(?:\{([^}]*)\})?\s+(\S+)\s*$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(s):
    return {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(s or "")}


def parse_metrics(text):
    """The policy of one shard from its /metrics text: a dict with "policy",
    "budget_bits", "max_transform_gflops" and "tensors", a list of dicts (key,
    tensor, mode, rank, push_codec, pull_codec, predicted_ratio, bits), one per
    geometry tensor the shard owns, in key order."""
    out = {"policy": None, "budget_bits": 0.0, "max_transform_gflops": 0.0, "tensors": []}
    rows = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), _labels(m.group(2)), m.group(3)
        try:
            v = float(value)
        except ValueError:
            continue
        if name == "giftd_policy":
            out["policy"] = labels.get("policy")
        elif name == "giftd_policy_budget":
            out["budget_bits"] = v
        elif name == "giftd_policy_max_transform_gflops":
            out["max_transform_gflops"] = v
        elif name in ("giftd_tensor_policy", "giftd_tensor_transform_rank",
                      "giftd_tensor_predicted_error_ratio", "giftd_tensor_element_cost"):
            key = int(labels.get("key", "-1"))
            r = rows.setdefault(key, {"key": key, "tensor": labels.get("tensor", "")})
            if name == "giftd_tensor_policy":
                r.update(mode=labels.get("mode"), push_codec=labels.get("push_codec"),
                         pull_codec=labels.get("pull_codec"))
            elif name == "giftd_tensor_transform_rank":
                r["rank"] = int(v)
            elif name == "giftd_tensor_predicted_error_ratio":
                r["predicted_ratio"] = v
            else:
                r["bits"] = v
    out["tensors"] = [rows[k] for k in sorted(rows)]
    return out


def _endpoints(servers, http):
    servers = servers or os.environ.get("GIFT_SERVERS") or "127.0.0.1:7070"
    hosts = [s.strip() for s in servers.split(",") if s.strip()]
    if http:
        https = [s.strip() for s in http.split(",") if s.strip()]
        if len(https) != len(hosts):
            raise ValueError(f"{len(https)} HTTP addresses for {len(hosts)} servers")
        return list(zip(hosts, https))
    out = []
    for h in hosts:
        host, _, port = h.rpartition(":")
        out.append((h, f"{host}:{int(port) + 1}"))  # giftrun's and giftctl's default
    return out


def shard_policies(servers=None, http=None, timeout=5.0):
    """parse_metrics of every shard, with its "server", in server order
    (servers and http as for policy_table). Raises OSError when a shard's
    /metrics cannot be read."""
    out = []
    for server, addr in _endpoints(servers, http):
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout) as r:
            shard = parse_metrics(r.read().decode("utf-8", "replace"))
        shard["server"] = server
        out.append(shard)
    return out


def policy_table(servers=None, http=None, timeout=5.0):
    """Every shard's policy and decisions: a list of dicts, one per geometry
    tensor owned by some shard (parse_metrics's rows plus "server" and
    "policy"), in server then key order. servers: host:port,... of the
    protocol ports (default $GIFT_SERVERS); http: their HTTP ports, one per
    server (default: each port + 1). Raises OSError when a shard's /metrics
    cannot be read."""
    table = []
    for shard in shard_policies(servers, http, timeout):
        for row in shard["tensors"]:
            row.update(server=shard["server"], policy=shard["policy"],
                       budget_bits=shard["budget_bits"])
            table.append(row)
    return table
