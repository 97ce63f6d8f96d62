#!/usr/bin/env python3
"""Checks the Kubernetes manifests in deploy/k8s beyond YAML syntax.

    check_manifests.py K8S_DIR [DDPRUN_HELP_FILE]

Each file must parse (yaml.safe_load_all) and hold what its recipe relies on:
the indexed Job's node count, completion index, headless Service and pod-0
DNS name agree with each other; the MPIJob's rank count is workers x slots and
MASTER_ADDR names worker 0 under the operator's Service. With DDPRUN_HELP_FILE
(the output of `ddprun --help`), every ddprun flag the manifests use must be one
ddprun knows. Prints one line per file; exits 1 on the first problem.
"""
import pathlib
import re
import sys

import yaml


def fail(path, message):
    print(f"check_manifests: {path.name}: {message}", file=sys.stderr)
    sys.exit(1)


def arg_after(args, flag, path):
    if flag not in args:
        fail(path, f"the command lacks {flag}")
    i = args.index(flag)
    if i + 1 >= len(args):
        fail(path, f"{flag} has no value")
    return args[i + 1]


def check_indexed_job(path, docs):
    services = [d for d in docs if d.get("kind") == "Service"]
    jobs = [d for d in docs if d.get("kind") == "Job"]
    if len(services) != 1 or len(jobs) != 1:
        fail(path, "expected one Service and one Job")
    svc, job = services[0], jobs[0]
    name, svc_name = job["metadata"]["name"], svc["metadata"]["name"]
    if svc["spec"].get("clusterIP") != "None":
        fail(path, "the Service must be headless (clusterIP: None)")
    if svc["spec"].get("selector", {}).get("job-name") != name:
        fail(path, f"the Service must select job-name: {name}")
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        fail(path, "the Job must be completionMode: Indexed")
    pod = spec["template"]["spec"]
    if pod.get("subdomain") != svc_name:
        fail(path, f"the pods' subdomain must be the Service's name {svc_name}")
    container = pod["containers"][0]
    if container.get("command") != ["ddprun"]:
        fail(path, "the container must run ddprun")
    args = [str(a) for a in container["args"]]
    nnodes = int(arg_after(args, "--nnodes", path))
    if not spec.get("completions") == spec.get("parallelism") == nnodes:
        fail(path, f"completions, parallelism and --nnodes must be equal ({nnodes})")
    if arg_after(args, "--node-rank", path) != "$(JOB_COMPLETION_INDEX)":
        fail(path, "--node-rank must be $(JOB_COMPLETION_INDEX)")
    master = arg_after(args, "--master-addr", path)
    if not master.startswith(f"{name}-0.{svc_name}"):
        fail(path, f"--master-addr {master} is not pod 0 ({name}-0.{svc_name})")
    port = int(arg_after(args, "--master-port", path))
    # MASTER_PORT (rank 0's store) and ddprun's agents' store on MASTER_PORT + 1.
    for p in (port, port + 1):
        if p not in [q["port"] for q in svc["spec"]["ports"]]:
            fail(path, f"the Service does not list port {p} (MASTER_PORT {port}, the agents' store {port + 1})")
    return args


def check_mpijob(path, docs):
    if len(docs) != 1 or docs[0].get("kind") != "MPIJob":
        fail(path, "expected one MPIJob")
    job = docs[0]
    if job.get("apiVersion") != "kubeflow.org/v2beta1":
        fail(path, f"apiVersion {job.get('apiVersion')}, expected kubeflow.org/v2beta1")
    name, spec = job["metadata"]["name"], job["spec"]
    replicas = spec["mpiReplicaSpecs"]
    if set(replicas) != {"Launcher", "Worker"} or replicas["Launcher"].get("replicas") != 1:
        fail(path, "expected one Launcher and a Worker replica spec")
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    if launcher.get("command") != ["mpirun"]:
        fail(path, "the launcher must run mpirun")
    args = [str(a) for a in launcher["args"]]
    ranks = replicas["Worker"]["replicas"] * spec.get("slotsPerWorker", 1)
    if int(arg_after(args, "-np", path)) != ranks:
        fail(path, f"-np must be workers x slotsPerWorker = {ranks}")
    master = next((a for a in args if a.startswith("MASTER_ADDR=")), None)
    if master != f"MASTER_ADDR={name}-worker-0.{name}":
        fail(path, f"expected -x MASTER_ADDR={name}-worker-0.{name}, got {master}")
    return []


def main():
    k8s = pathlib.Path(sys.argv[1])
    help_text = pathlib.Path(sys.argv[2]).read_text() if len(sys.argv) > 2 else None
    checks = {"indexed-job.yaml": check_indexed_job, "mpijob.yaml": check_mpijob}
    for path in sorted(k8s.glob("*.yaml")):
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            fail(path, f"not valid YAML: {e}")
        check = checks.get(path.name)
        if check is None:
            fail(path, "no check for this manifest: add one to deploy/check_manifests.py")
        args = check(path, docs)
        ddprun_args = args[: args.index("train")] if "train" in args else args
        if help_text is not None:
            for flag in (a for a in ddprun_args if a.startswith("--")):
                if not re.search(re.escape(flag) + r"(?![\w-])", help_text):
                    fail(path, f"ddprun does not know {flag} (ddprun --help)")
        print(f"check_manifests: {path.name}: ok ({', '.join(d['kind'] for d in docs)})")
    missing = set(checks) - {p.name for p in k8s.glob("*.yaml")}
    if missing:
        fail(k8s / sorted(missing)[0], "missing")


if __name__ == "__main__":
    main()
