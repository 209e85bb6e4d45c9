#!/usr/bin/env bash
# The speed-up testbed: two network namespaces joined by a 1 Gbit/s veth link.
#
#   sudo benchmarks/testbed.sh up     # create it (idempotent: recreated from scratch)
#   sudo benchmarks/testbed.sh down   # remove everything it created (idempotent)
#   benchmarks/testbed.sh status      # show what exists
#
# `up` creates namespaces disco_ns0 and disco_ns1, a veth pair disco_veth0 (in
# disco_ns0, 10.77.0.1/24) and disco_veth1 (in disco_ns1, 10.77.0.2/24), brings up
# both ends and each namespace's loopback, and shapes both ends with
#   tc qdisc add dev <end> root tbf rate 1gbit burst 1mb latency 100ms
# (so each direction runs at 1 Gbit/s; measured 0.97 Gbit/s, see design notes §2).
# It touches nothing else: no address outside 10.77.0.0/24, no host interface, no
# route in the root namespace. Needs root (CAP_NET_ADMIN) and iproute2.
#
# Run a 2-process job across the link with
#   .venv/bin/python benchmarks/testbed_launch.py benchmarks/measure_speedup.py ARGS
# (rank 0 in disco_ns0 also hosts the jax.distributed coordinator; gloo is bound
# to each namespace's address, since it would otherwise take the hostname's).
set -euo pipefail

NS0=disco_ns0
NS1=disco_ns1
VETH0=disco_veth0
VETH1=disco_veth1
IP0=10.77.0.1
IP1=10.77.0.2
RATE=${DISCO_TESTBED_RATE:-1gbit}

down() {
    # Deleting a namespace deletes the veth end inside it, and with it the pair.
    for ns in "$NS0" "$NS1"; do
        if ip netns list | grep -qw "^$ns"; then
            ip netns del "$ns"
        fi
    done
    # A half-made pair left in the root namespace by an interrupted `up`.
    for link in "$VETH0" "$VETH1"; do
        if ip link show "$link" >/dev/null 2>&1; then
            ip link del "$link"
        fi
    done
}

up() {
    down
    ip netns add "$NS0"
    ip netns add "$NS1"
    ip link add "$VETH0" type veth peer name "$VETH1"
    ip link set "$VETH0" netns "$NS0"
    ip link set "$VETH1" netns "$NS1"
    ip -n "$NS0" addr add "$IP0/24" dev "$VETH0"
    ip -n "$NS1" addr add "$IP1/24" dev "$VETH1"
    for pair in "$NS0:$VETH0" "$NS1:$VETH1"; do
        ns=${pair%%:*}
        link=${pair##*:}
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$link" up
        ip netns exec "$ns" tc qdisc add dev "$link" root tbf rate "$RATE" burst 1mb latency 100ms
    done
    echo "testbed up: $NS0 ($IP0) <-> $NS1 ($IP1), $RATE each way"
}

status() {
    for ns in "$NS0" "$NS1"; do
        if ip netns list | grep -qw "^$ns"; then
            echo "== $ns"
            ip -n "$ns" -brief addr
            ip netns exec "$ns" tc qdisc show
        else
            echo "== $ns: absent"
        fi
    done
}

case "${1:-}" in
    up) up ;;
    down) down; echo "testbed down" ;;
    status) status ;;
    *)
        echo "usage: $0 up|down|status" >&2
        exit 2
        ;;
esac
