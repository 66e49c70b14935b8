// window.cuh — device-side walks over a window (spatial.h's om_window, as conv.c and pool.c
// walk it), shared by conv.cu and pool.cu. Include after ops/spatial.h.
#pragma once

// o (< OS) into its (od, oh, ow)
__device__ __forceinline__ void out_coords(const om_window &w, int64_t o, int64_t *od, int64_t *oh, int64_t *ow) {
    *ow = o % w.out[2];
    int64_t t = o / w.out[2];
    *oh = t % w.out[1];
    *od = t / w.out[1];
}

// Calls f(at) for every tap of the window at output position (od, oh, ow) that lies inside the
// input (taps in the padding are skipped), in tap order (kd, then kh, then kw): at is the tap's
// flat index (id * IH + ih) * IW + iw in its plane. MaxPool's and AveragePool's walk.
template <typename F>
__device__ __forceinline__ void for_taps_in(const om_window &w, int64_t od, int64_t oh, int64_t ow, F f) {
    for (int64_t kd = 0; kd < w.k[0]; kd++) {
        const int64_t id = od * w.s[0] - w.pb[0] + kd * w.d[0];
        if (id < 0 || id >= w.in[0]) continue;
        for (int64_t kh = 0; kh < w.k[1]; kh++) {
            const int64_t ih = oh * w.s[1] - w.pb[1] + kh * w.d[1];
            if (ih < 0 || ih >= w.in[1]) continue;
            for (int64_t kw = 0; kw < w.k[2]; kw++) {
                const int64_t iw = ow * w.s[2] - w.pb[2] + kw * w.d[2];
                if (iw < 0 || iw >= w.in[2]) continue;
                f((id * w.in[1] + ih) * w.in[2] + iw);
            }
        }
    }
}

// The other way round: calls f(k, od, oh, ow) for every window that holds input position (id, ih, iw): k is the tap
// ((kd * KH + kh) * KW + kw), (od, oh, ow) the window's output position. The gather col2im and
// AveragePoolGrad run instead of scattering with atomics.
template <typename F>
__device__ __forceinline__ void for_windows_of(const om_window &w, int64_t id, int64_t ih, int64_t iw, F f) {
    for (int64_t kd = 0; kd < w.k[0]; kd++) {
        const int64_t td = id + w.pb[0] - kd * w.d[0];
        if (td < 0 || td % w.s[0]) continue;
        const int64_t od = td / w.s[0];
        if (od >= w.out[0]) continue;
        for (int64_t kh = 0; kh < w.k[1]; kh++) {
            const int64_t th = ih + w.pb[1] - kh * w.d[1];
            if (th < 0 || th % w.s[1]) continue;
            const int64_t oh = th / w.s[1];
            if (oh >= w.out[1]) continue;
            for (int64_t kw = 0; kw < w.k[2]; kw++) {
                const int64_t tw = iw + w.pb[2] - kw * w.d[2];
                if (tw < 0 || tw % w.s[2]) continue;
                const int64_t ow = tw / w.s[2];
                if (ow >= w.out[2]) continue;
                f((kd * w.k[1] + kh) * w.k[2] + kw, od, oh, ow);
            }
        }
    }
}
