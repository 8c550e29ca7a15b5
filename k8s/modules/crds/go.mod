// Not built: pins the releases whose CustomResourceDefinitions the tests install into the real control plane
// (k8s/build.sh downloads them): the Prometheus Operator's PodMonitor and ServiceMonitor (example/prometheus-operator-crd/),
// so that the chart renders and installs its monitors and the tests' discovery reads them, and Kubeflow Trainer's
// TrainJob (manifests/base/crds/), so that TrainJobs as attune writes them meet the server's schema.
module attune.local/k8s/modules/crds

go 1.26.0

require (
	github.com/kubeflow/trainer/v2 v2.2.0
	github.com/prometheus-operator/prometheus-operator v0.89.0
)
