"""The foundations every layer may import: errors, the registry, seeds, the option and config schemas,
statistics, the code version, OS processes, the progress bar, the trackers, checksums and the YAML
reader. Importing the package runs none of them."""
