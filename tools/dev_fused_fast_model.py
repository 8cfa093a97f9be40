#!/usr/bin/env python3
"""What single-bf16 tensor-core products (the precision class of FLA / FlashInfer: the state cast to bf16 inside the
products, a bf16 inverse) would do to deltakit's chunk prefill, on the CPU: tools/dev_fused_plan.py's emulation of the
split pipeline with three operand-precision modes against a float64 token recurrence.
  exact    today's kernels: S as bf16 hi + lo, E x Tb and the blocked inverse as bf16-triple products
  fast     S hi only, single bf16 products everywhere, single-product inverse
  fast_s2  fast with the hi / lo state update kept
Usage: python3 tools/dev_fused_fast_model.py   (session 10; ~1 min)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
from dev_fused_plan import bf, split, dexp, recurrence, inv_blocks
def inv_single(A):
    n=64; A=A.astype(np.float32); Tm=np.zeros((n,n),np.float32); D=[]
    for b in range(4):
        a=A[16*b:16*b+16,16*b:16*b+16]; inv=np.eye(16,dtype=np.float32)
        for i in range(1,16): inv[i]=inv[i]-(a[i,:i,None]*inv[:i]).sum(0,dtype=np.float32)
        D.append(inv); Tm[16*b:16*b+16,16*b:16*b+16]=inv
    mm=lambda x,y:(bf(x)@bf(y)).astype(np.float32)
    blk=lambda M,i,j:M[16*i:16*i+16,16*j:16*j+16]
    for lvl in range(1,4):
        for j in range(0,4-lvl):
            i=j+lvl; X=np.zeros((16,16),np.float32)
            for m in range(j,i): X=X+mm(blk(A,i,m),blk(Tm,m,j))
            Tm[16*i:16*i+16,16*j:16*j+16]=-mm(D[i],X)
    return Tm
def fused(q,k,v,g,beta,S0,scale,mode):
    T,K=k.shape; V=v.shape[1]; St=S0.T.astype(np.float32).copy(); o=np.zeros((T,V))
    qb,kb,vb=bf(q),bf(k),bf(v)
    for c0 in range(0,T,64):
        n=min(64,T-c0)
        Kc=np.zeros((64,K));Kc[:n]=kb[c0:c0+n];Qc=np.zeros((64,K));Qc[:n]=qb[c0:c0+n];Vc=np.zeros((64,V));Vc[:n]=vb[c0:c0+n]
        gg=np.zeros(64,np.float32);gg[:n]=np.maximum(g[c0:c0+n],-64.0);be=np.zeros(64,np.float32);be[:n]=beta[c0:c0+n]
        gc=np.cumsum(gg,dtype=np.float32);rk=(1/np.sqrt((Kc**2).sum(1)+1e-6)).astype(np.float32);rq=(1/np.sqrt((Qc**2).sum(1)+1e-6)).astype(np.float32)
        m=np.arange(64)<n;r=np.arange(64);low=r[:,None]>r[None,:]
        A=(Kc@Kc.T).astype(np.float32)*(be*rk)[:,None]*rk[None,:]
        A=np.where(low,A*dexp(np.where(low,gc[:,None]-gc[None,:],0.0)),0.0).astype(np.float32)
        Tm=inv_blocks(A,'hilo') if mode=='exact' else inv_single(A)
        Tb=(Tm*be[None,:]).astype(np.float32); cz=r[:,None]>=r[None,:]
        P=(Qc@Kc.T).astype(np.float32)*(rq*scale)[:,None]*rk[None,:]
        P=np.where(cz,P*dexp(np.where(cz,gc[:,None]-gc[None,:],0.0)),0.0).astype(np.float32)
        sh,sl=split(St)
        if mode=='exact': Xt=(sh@Kc.T+sl@Kc.T).astype(np.float32)
        else: Xt=(sh@Kc.T).astype(np.float32)
        xsc=np.where(m,dexp(gc)*rk,0.0).astype(np.float32)
        Et=(Vc.T-Xt*xsc[None,:]).astype(np.float32)
        eh,el=split(Et);th,tl=split(Tb)
        if mode=='exact': vn=(eh@th.T+(eh@tl.T+el@th.T)).astype(np.float32)
        else: vn=(eh@th.T).astype(np.float32)
        O1=(sh@Qc.T).astype(np.float32)*(np.where(m,rq*scale*dexp(gc),0.0))[None,:]
        ph,pl=split(P);vh,vl=split(vn)
        O2=vh@ph.T
        o[c0:c0+n]=bf((O1+O2).T[:n].astype(np.float32))
        kdec=np.where(m,dexp(gc[63]-gc)*rk,0.0).astype(np.float32)
        wh,wl=split(vn*kdec[None,:])
        if mode=='exact' or mode=='fast_s2': St=(St*np.float32(dexp(gc[63]))+(wh@Kc+wl@Kc)).astype(np.float32)
        else: St=(St*np.float32(dexp(gc[63]))+(wh@Kc)).astype(np.float32)
    return o,St.T
rng=np.random.default_rng(1)
for (T,K,V,gm) in [(1000,128,128,'norm'),(2048,128,128,'slow'),(1000,128,128,'corr')]:
    q=bf(rng.standard_normal((T,K)).astype(np.float32));k=rng.standard_normal((T,K)).astype(np.float32)
    if gm=='corr': base=rng.standard_normal(K); k=(base[None,:]*2+0.5*k).astype(np.float32)
    k=bf(k); v=bf(rng.standard_normal((T,V)).astype(np.float32))
    g=-np.abs(rng.standard_normal(T)*(0.02 if gm=='slow' else 0.3)).astype(np.float32)
    beta=(1/(1+np.exp(-rng.standard_normal(T)))).astype(np.float32)
    S0=rng.standard_normal((K,V)).astype(np.float32)*0.5; sc=K**-0.5
    ro,rS=recurrence(q,k,v,g,beta,S0,sc)
    for mode in ['exact','fast','fast_s2']:
        fo,fS=fused(q,k,v,g,beta,S0,sc,mode)
        print(T,gm,mode,'out %.2e state %.2e'%(np.linalg.norm(fo-ro)/np.linalg.norm(ro),np.linalg.norm(fS-rS)/np.linalg.norm(rS)),flush=True)
