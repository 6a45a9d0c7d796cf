"""Container entry point of the deployment images (deploy/docker) and the Helm chart.

`python -m dflash_trt.deploy.entrypoint <serve|prepare|engine|repo|demo|health|check-runtime>`
turns a few arguments into the project's own `make` targets; `plan` holds the pure logic.
"""
