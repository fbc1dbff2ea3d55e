"""The model as a layer graph: real model definitions built from configs (`modelzoo`), traced on the meta device
(`build`, one module per step: `blocks`, `tracing`, `traced_costs`, `node_attrs`, `assembly`), the graph type
(`layer_graph`), each module's tensor-parallel role (`tp_roles`), and the graphs kept on disk (`cache`, the one way
to get a graph)."""
