"""Tools beside the data path: machine probes, bench, monitor, doctor, tune, the demo."""
