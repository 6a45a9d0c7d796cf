"""Facts of the rendered Deployment: GPUs, shared memory, probes, ports, storage modes, CPU profile."""

import pytest
from chart_render import container, only, pod_spec, profile_values, render

GPU = "nvidia.com/gpu"


def _objects(profile="default", **extra):
    return render(profile_values(profile, extra))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_requests_one_gpu_per_tensor_parallel_rank(tp):
    objects = _objects(tensorParallel=tp)
    for name in ("triton", "prepare"):
        resources = container(objects, name)["resources"]
        assert resources["requests"][GPU] == tp and resources["limits"][GPU] == tp, name
    assert f"--tp={tp}" in container(objects)["args"]
    assert f"--tp={tp}" in container(objects, "prepare")["args"]


def test_default_is_tensor_parallel_8_on_gpu_nodes():
    objects = _objects()
    assert container(objects)["resources"]["limits"][GPU] == 8
    spec = pod_spec(objects)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_gpt_oss_120b_profile_pins_h200_or_b200_nodes_at_tp8():
    objects = _objects("gpt-oss-120b-tp8")
    assert container(objects)["resources"]["requests"][GPU] == 8
    terms = pod_spec(objects)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (expression,) = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert expression["key"] == "nvidia.com/gpu.product"
    assert set(expression["values"]) == {"NVIDIA-H200", "NVIDIA-B200"}
    assert "--runtime=trtllm" in container(objects, "prepare")["args"]


def test_cpu_profile_requests_no_gpu_and_needs_no_gpu_node():
    objects = _objects("cpu")
    spec = pod_spec(objects)
    for item in spec["containers"] + spec["initContainers"]:
        for section in ("requests", "limits"):
            assert GPU not in item["resources"].get(section, {}), item["name"]
    assert "nodeSelector" not in spec and "tolerations" not in spec and "affinity" not in spec
    assert container(objects)["image"] == "dflash-trt-cpu:0.1.0"
    assert "--model=smollm2-135m" in container(objects, "prepare")["args"]


def test_dev_shm_is_a_sized_memory_volume_mounted_in_every_container():
    objects = _objects(shm={"sizeLimit": "48Gi"})
    spec = pod_spec(objects)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "48Gi"}
    for item in spec["containers"] + spec["initContainers"]:
        assert {"name": "dshm", "mountPath": "/dev/shm"} in item["volumeMounts"], item["name"]


@pytest.mark.parametrize(
    "probe, path", [("startupProbe", "/health/ready"), ("readinessProbe", "/health/ready"),
                    ("livenessProbe", "/health/live")]
)
def test_probes_ask_the_model_aware_health_endpoints_of_the_server(probe, path):
    # Triton's own /v2/health/* stay 200 when a model process died: the probes ask `dflash-trt serve`.
    triton = container(_objects())
    assert triton[probe]["httpGet"] == {"path": path, "port": "health"}
    (health,) = [port for port in triton["ports"] if port["name"] == "health"]
    assert health["containerPort"] == 8003
    assert "--health-port=8003" in triton["args"]


@pytest.mark.parametrize("grace, margin, drain", [(120, 15, "105"), (300, 30, "270"), (10, 15, "0")])
def test_the_drain_is_the_grace_period_less_the_margin(grace, margin, drain):
    triton = container(_objects(terminationGracePeriodSeconds=grace, server={"shutdownMarginSeconds": margin}))
    assert {"name": "DFLASH_DRAIN_TIMEOUT", "value": drain} in triton["env"]
    assert pod_spec(_objects(terminationGracePeriodSeconds=grace))["terminationGracePeriodSeconds"] == grace


def test_startup_budget_allows_half_an_hour_for_a_120b_load():
    startup = container(_objects("gpt-oss-120b-tp8"))["startupProbe"]
    budget = startup["initialDelaySeconds"] + startup["periodSeconds"] * startup["failureThreshold"]
    assert 25 * 60 <= budget <= 35 * 60
    assert container(_objects("gpt-oss-120b-tp8"))["args"].count("--ready-timeout=1800") == 1


def test_container_ports_are_http_grpc_metrics_health():
    ports = {p["name"]: p["containerPort"] for p in container(_objects())["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "health": 8003}


def test_openai_gateway_adds_port_9000_and_serve_argument():
    triton = container(_objects(openai={"enabled": True}))
    assert {"name": "openai", "containerPort": 9000, "protocol": "TCP"} in triton["ports"]
    assert "--openai-port=9000" in triton["args"]


def test_build_mode_prepares_engine_and_repository_in_an_init_container():
    objects = _objects()
    prepare = container(objects, "prepare")
    assert prepare["args"][:5] == [
        "prepare", "--model=gpt-oss-120b", "--tp=8",
        "--engine=/data/engines/gpt-oss-120b-tp8", "--repo=/data/model_repository/gpt-oss-120b-tp8",
    ]
    (data,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "data"]
    assert data["emptyDir"]["sizeLimit"] == "200Gi"


def test_build_mode_with_a_claim_builds_into_it_read_write():
    objects = _objects(storage={"existingClaim": "engines"})
    (data,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "data"]
    assert data["persistentVolumeClaim"] == {"claimName": "engines", "readOnly": False}
    assert container(objects, "prepare")["name"] == "prepare"


def test_pvc_mode_mounts_the_claim_read_only_without_init_container():
    objects = _objects(storage={"mode": "pvc", "existingClaim": "engines", "subPath": "v1"})
    spec = pod_spec(objects)
    assert "initContainers" not in spec
    (data,) = [v for v in spec["volumes"] if v["name"] == "data"]
    assert data["persistentVolumeClaim"] == {"claimName": "engines", "readOnly": True}
    (mount,) = [m for m in container(objects)["volumeMounts"] if m["name"] == "data"]
    assert mount == {"name": "data", "mountPath": "/data", "subPath": "v1", "readOnly": True}


def test_triton_serves_the_prepared_repository_without_building():
    args = container(_objects(storage={"mode": "pvc", "existingClaim": "engines"}))["args"]
    assert args[:4] == ["serve", "--no-build", "--engine=/data/engines/gpt-oss-120b-tp8",
                        "--repo=/data/model_repository/gpt-oss-120b-tp8"]


def test_model_name_overrides_the_directory_names():
    args = container(_objects(model={"name": "gptoss-v2"}))["args"]
    assert "--repo=/data/model_repository/gptoss-v2" in args


def test_checkpoints_claim_is_mounted_read_only_and_named_by_hf_home():
    objects = _objects(checkpoints={"existingClaim": "hf-cache"})
    for name in ("triton", "prepare"):
        item = container(objects, name)
        assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in item["volumeMounts"]
        assert {"name": "HF_HOME", "value": "/checkpoints"} in item["env"]


def test_runs_as_non_root_with_a_read_only_root_filesystem_and_writable_tmp():
    objects = _objects()
    spec = pod_spec(objects)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert spec["automountServiceAccountToken"] is False
    triton = container(objects)
    assert triton["securityContext"]["readOnlyRootFilesystem"] is True
    assert triton["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in triton["volumeMounts"]
    assert {"name": "HOME", "value": "/tmp"} in triton["env"]


def test_autoscaled_deployment_leaves_replicas_to_the_hpa():
    assert "replicas" not in only(_objects(autoscaling={"enabled": True}), "Deployment")["spec"]
    assert only(_objects(replicaCount=2), "Deployment")["spec"]["replicas"] == 2


def test_triton_starts_under_the_launcher_the_values_name():
    assert "--launcher=auto" in container(_objects())["args"]  # mpirun for TensorRT-LLM engines
    assert "--launcher=mpirun" in container(_objects("gpt-oss-120b-tp8"))["args"]
    assert "--launcher=plain" in container(_objects(server={"launcher": "plain"}))["args"]


def test_with_the_openai_gateway_the_repository_is_rendered_without_a_chat_template():
    # The gateway templates whole conversations itself; a repository that templates too (the default, auto)
    # would serve single-user-message chats only.
    assert "--chat-template=none" in container(_objects(openai={"enabled": True}), "prepare")["args"]
    assert not any(a.startswith("--chat-template") for a in container(_objects(), "prepare")["args"])
