# ports.sh: sourced by the tools checks. free_base_port N prints a port P such
# that P..P+N-1 are free on 127.0.0.1 now, chosen below the kernel's ephemeral
# range (net.ipv4.ip_local_port_range): a port in that range can be taken at
# any moment by an outgoing connection of a test running beside this one,
# which is how a fixed port came to be "already in use" in CI. A check and a
# later bind still race with other fixed-port users, so callers keep a retry.
free_base_port() {
    local n=${1:?usage: free_base_port N} lo=32768 try p ok
    read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
    ((lo > 10000 + 2 * n)) || lo=32768
    for _ in $(seq 1 50); do
        try=$((10000 + 2 * (RANDOM % ((lo - 10000 - n) / 2))))
        ok=1
        for ((p = try; p < try + n; p++)); do
            # ss (iproute2, from scripts/deps.sh): no socket in any state holds p
            if ss -Htan "( sport = :$p )" 2>/dev/null | grep -q .; then ok=0; break; fi
        done
        ((ok)) && { echo "$try"; return 0; }
    done
    echo "free_base_port: no $n free ports below $lo" >&2
    return 1
}
