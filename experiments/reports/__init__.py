"""Reports: the statistics, the pages, plots and notes the driver (`experiments.reproduce`)
writes from the committed records, and the records' provenance."""
