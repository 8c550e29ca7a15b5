"""The Kubernetes operator: TuningRun/TuningTrial resources, the kopf handlers and the gate webhook.

Only this package imports kopf and kubernetes; the engine, the gate and the recipe model stay free of them.
"""
