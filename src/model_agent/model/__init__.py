"""Pure model logic shared by every layer: CR views, storage URIs, node selection, label and ConfigMap keys,
and the ConfigMap entry format. No I/O and no Kubernetes client here; import from the submodules.
"""
