"""Droplets to cells: barcode ranks, cell calling (EmptyDrops, Cell Ranger's), ambient RNA removal."""
