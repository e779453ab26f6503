"""atac"""
