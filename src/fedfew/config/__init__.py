"""The experiment config: loaded from YAML with its overrides (:mod:`fedfew.config.loading`), checked
against the schema and the registries (:mod:`fedfew.config.validation`, with the checks across sections in
:mod:`fedfew.config.constraints`), the engines by name (:mod:`fedfew.config.engines`) and the plugin files
a config names (:mod:`fedfew.config.plugins`)."""
