"""From one process to many: single-process baseline, nn.DataParallel and DDP training."""
