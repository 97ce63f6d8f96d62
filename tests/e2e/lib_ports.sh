# free_port and free_port_besides, sourced by the e2e tests and benchmarks that
# start ddprun (lib_ddprun.sh, train_elastic_nnodes.sh, bench/elastic_nodes.sh).
# A port P with P + 1 free too: ddprun's agents' store listens on --master-port + 1
# (--rdzv-port's default), and a P + 1 taken by another test's connection made
# e2e.ddprun_torch fail once ("cannot listen on 127.0.0.1:P+1: Address already in use").
# P is drawn below the kernel's ephemeral range, from which every connect() and
# bind to port 0 of the tests running beside this one take theirs: a port from
# that range (as bind(0) gives) could be taken again before ddprun listens on it,
# which failed e2e.ddprun_rendezvous once with three tests at a time.
free_port() {
  python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    if low > 10002:
        p = random.randrange(10000, low - 1)
    else:  # no room below the ephemeral range: take one from it
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
    try:
        with socket.socket() as s, socket.socket() as t:
            s.bind(("127.0.0.1", p))
            t.bind(("127.0.0.1", p + 1))
    except OSError:
        continue
    print(p)
    break
else:
    raise SystemExit("no free pair of ports")'
}

# free_port_besides P: a free port pair as above, other than P - 1, P and P + 1 (a
# second store on the same machine: ddprun --rdzv-backup in the tests and benchmarks).
free_port_besides() {
  local b=$1
  while [ "$b" -ge "$(($1 - 1))" ] && [ "$b" -le "$(($1 + 1))" ]; do b=$(free_port); done
  echo "$b"
}
