"""A run and its commands: the built experiment, the run folder and its lifecycle, the summary, the
trial pass, the data and environment records, run and resume, evaluate, sweep. Importing the package
runs none of them."""
