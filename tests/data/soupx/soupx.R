# R SoupX on the inputs make_reference.py writes to the folder args[1]; outputs written beside them.
suppressPackageStartupMessages({library(Matrix); library(SoupX)})
args = commandArgs(TRUE); dir = args[1]
read = function(name) as(t(readMM(file.path(dir, name))), 'CsparseMatrix')
tod = read('raw.mtx'); toc = read('cells.mtx')
# Names that sort as the indices do, so that SoupX breaks ties in gene order.
rownames(tod) = rownames(toc) = sprintf('g%05d', seq_len(nrow(toc)) - 1)
colnames(tod) = paste0('d', seq_len(ncol(tod))); colnames(toc) = paste0('c', seq_len(ncol(toc)))
sc = SoupChannel(tod, toc)
sc = setClusters(sc, readLines(file.path(dir, 'clusters.txt')))
sc = autoEstCont(sc, tfidfMin=as.numeric(args[2]), doPlot=FALSE, verbose=FALSE)
write17 = function(x, name) writeLines(sprintf('%.17g', x), file.path(dir, name))
write17(sc$soupProfile$est, 'soup.txt')
write17(c(sc$fit$rhoEst, sc$fit$rhoFWHM), 'rho.txt')
writeLines(unique(sc$fit$dd$gene), file.path(dir, 'markers.txt'))
writeLines(as.character(packageVersion('SoupX')), file.path(dir, 'version.txt'))
entries = function(m, name) {
  m = as(m, 'TsparseMatrix')
  write.table(data.frame(cell=m@j, gene=m@i, x=sprintf('%.17g', m@x)), file.path(dir, name),
              row.names=FALSE, quote=FALSE)
}
entries(adjustCounts(sc, verbose=0), 'by_cluster.txt')
entries(adjustCounts(sc, clusters=FALSE, verbose=0), 'by_cell.txt')
sc = setContaminationFraction(sc, setNames(as.numeric(readLines(file.path(dir, 'cell_rho.txt'))), colnames(toc)))
entries(adjustCounts(sc, verbose=0), 'by_cluster_cell_rho.txt')
