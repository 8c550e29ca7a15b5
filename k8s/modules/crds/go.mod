// Not built: pins the release of the Prometheus Operator whose CustomResourceDefinitions (PodMonitor,
// ServiceMonitor; example/prometheus-operator-crd/ in its module) the tests install into the real control plane, so
// that the chart renders and installs its monitors and the tests' discovery reads them (k8s/build.sh downloads it).
module attune.local/k8s/modules/crds

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.89.0
